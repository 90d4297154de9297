"""OpenAI-compatible serving on the Twinkle server's own keys: ``/v1/models``,
``/v1/chat/completions`` and ``/v1/completions``, so a tenant points any OpenAI client
(``OpenAI(base_url=".../v1", api_key="tml-...")``) at the base model or an adapter it
trained. ``model`` names the base model, a ``twinkle://<run>/<kind>/<name>`` checkpoint
the caller owns, or ``twinkle://<run>`` for that run's latest sampler weights.

Sampling goes through the server's SamplerService, in the caller's lane of the sampler's
worker, like the Twinkle and Tinker sampler routes. ``stream=true`` answers with
server-sent events in OpenAI's chunk format, one chunk per generated token, sent as the
sampler draws it where the sampler streams (``live_stream``), else once the completion is
done (``answers.stream``).
"""

from twinkle.server.openai.routes import router

__all__ = ["router"]
