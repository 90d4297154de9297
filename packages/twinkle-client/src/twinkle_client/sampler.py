"""vLLMSampler, remotely: sampling on the server from the base model or a saved adapter.

``sample(..., adapter_uri=twinkle_path)`` samples with a checkpoint this key saved
(``model.save(...)`` returns the path). The result holds ``'sequences'`` (every prompt's
SampledSequences, in prompt order, as the documents' loops read them) and ``'responses'``
(one SampleResponse per prompt, as a local sampler returns them). The server decides which
engine runs (TorchSampler on a CPU server, vLLM on a GPU one).
"""

from __future__ import annotations

from typing import Any

from twinkle.data_format import SampledSequence, SampleResponse
from twinkle_client._wire import batch_rows, clean, name_of
from twinkle_client.manager import TwinkleClient, get_client


class vLLMSampler:  # noqa: N801 - the documents' name
    def __init__(
        self,
        model_id: str | None = None,
        *,
        client: TwinkleClient | None = None,
        **engine_args: Any,
    ) -> None:
        self.model_id = model_id
        self.client = get_client(client)

    def set_template(self, template: Any, **kwargs: Any) -> None:
        kwargs.pop("model_id", None)
        body = {"template": name_of(template, "template"), "kwargs": clean(kwargs)}
        self.client.call("/sampler/set_template", body)

    def sample(
        self,
        inputs: Any,
        sampling_params: Any = None,
        num_samples: int | None = None,
        *,
        adapter_uri: str | None = None,
    ) -> dict[str, Any]:
        if sampling_params is not None and hasattr(sampling_params, "to_dict"):
            sampling_params = sampling_params.to_dict()
        body = clean(
            {
                "inputs": batch_rows(inputs),
                "sampling_params": sampling_params,
                "num_samples": num_samples,
                "adapter_uri": adapter_uri,
            }
        )
        result = self.client.call("/sampler/sample", body)
        return {
            "sequences": [SampledSequence.from_dict(s) for s in result["sequences"]],
            "responses": [SampleResponse.from_dict(r) for r in result["responses"]],
        }


TorchSampler = vLLMSampler
"""Remotely the engine is the server's choice; both names reach the same service."""
