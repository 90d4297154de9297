"""Sampling: the parameters a Sampler takes and the sequences it returns."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self

from pydantic import Field, Strict, StrictFloat, StrictInt, field_validator, model_validator

from twinkle.data_format._base import DataModel
from twinkle.data_format.features import InputFeature

# A (token_id, logprob) pair; lax only in the container, so JSON lists become tuples while
# the id and the logprob stay strictly typed.
_Pair = Annotated[tuple[StrictInt, StrictFloat], Strict(False)]
TopLogprobs = list[_Pair]
"""One position's ``(token_id, logprob)`` pairs, best first."""


class SamplingParams(DataModel):
    """How to sample. ``top_k=-1`` disables top-k; ``stop`` is a string, a list of strings
    or a list of token ids; ``logprobs=n`` returns the top ``n`` logprobs of each sampled
    position besides the sampled token's own; ``prompt_logprobs`` does the same for the
    prompt. ``ignore_eos`` keeps sampling past the end-of-sequence tokens: only ``stop``
    and ``max_tokens`` end a completion (Tinker's ``stop=[]``)."""

    max_tokens: int = Field(ge=1)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = -1
    seed: int | None = None
    stop: str | list[str] | list[int] | None = None
    num_samples: int = Field(default=1, ge=1)
    logprobs: int | None = Field(default=None, ge=0)
    prompt_logprobs: int | None = Field(default=None, ge=0)
    ignore_eos: bool = False

    @field_validator("top_k")
    @classmethod
    def _check_top_k(cls, value: int) -> int:
        if value != -1 and value < 1:
            raise ValueError(f"top_k must be -1 (disabled) or a positive int, got {value}")
        return value

    @field_validator("stop", mode="before")
    @classmethod
    def _check_stop(cls, value: Any) -> Any:
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, list) and (
            all(isinstance(item, str) for item in value)
            or all(isinstance(item, int) and not isinstance(item, bool) for item in value)
        ):
            return value
        raise ValueError(
            "stop must be a string, a list of strings or a list of token ids (ints), "
            f"not a mix; got {value!r}"
        )


class SampledSequence(DataModel):
    """One completion. ``logprobs[t]`` lists ``(token_id, logprob)`` pairs for position
    ``t``, the sampled token first (so ``logprobs[t][0][1]`` is its logprob), then the top
    alternatives. ``new_input_feature`` is prompt plus completion with labels on the
    completion only, ready for ``forward_backward``."""

    tokens: list[int]
    logprobs: list[TopLogprobs] | None = None
    stop_reason: Literal["stop", "length", "abort"]
    text: str | None = None
    new_input_feature: InputFeature | None = None

    @model_validator(mode="after")
    def _check_logprobs(self) -> Self:
        if self.logprobs is None:
            return self
        if len(self.logprobs) != len(self.tokens):
            raise ValueError(
                f"logprobs has {len(self.logprobs)} entries but tokens has {len(self.tokens)}"
            )
        for t, (token, pairs) in enumerate(zip(self.tokens, self.logprobs, strict=True)):
            if not pairs or pairs[0][0] != token:
                first = pairs[0][0] if pairs else None
                raise ValueError(
                    f"logprobs[{t}] must start with the sampled token {token}, got {first}"
                )
        return self


class SampleResponse(DataModel):
    """The sequences sampled for one prompt and, if asked for, the prompt's logprobs
    (``None`` at the first position, which has no context)."""

    sequences: list[SampledSequence]
    prompt_logprobs: list[TopLogprobs | None] | None = None


def sampled_input_features(samples: Any) -> list[InputFeature] | None:
    """The ``new_input_feature`` of every sequence in a sampler's result, in order, for
    ``model.forward_backward(inputs=sample_response)``: a SampleResponse, a SampledSequence, a
    list of either, or the dict a remote sampler returns (``{'sequences': [...], ...}``).
    None when ``samples`` is none of these (plain InputFeatures or Trajectories)."""
    if isinstance(samples, Mapping):  # a plain dict: the remote sampler's result
        if "sequences" not in samples or "input_ids" in samples:
            return None
        sequences = [
            s if isinstance(s, SampledSequence) else SampledSequence.from_dict(s)
            for s in samples["sequences"]
        ]
    elif isinstance(samples, SampleResponse | SampledSequence):
        sequences = _sequences_of([samples])
    elif (
        isinstance(samples, list | tuple)
        and samples
        and all(isinstance(s, SampleResponse | SampledSequence) for s in samples)
    ):
        sequences = _sequences_of(samples)
    else:
        return None
    features = []
    for index, sequence in enumerate(sequences):
        if sequence.new_input_feature is None:
            raise ValueError(
                f"sequence {index} of the sampler's result has no new_input_feature (the "
                "prompt was given as token ids only); pass InputFeatures of prompt plus "
                "completion instead"
            )
        features.append(sequence.new_input_feature)
    return features


def _sequences_of(samples: list | tuple) -> list[SampledSequence]:
    return [
        sequence
        for sample in samples
        for sequence in (sample.sequences if isinstance(sample, SampleResponse) else [sample])
    ]
