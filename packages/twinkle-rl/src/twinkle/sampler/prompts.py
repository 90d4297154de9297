"""What every sampler does around generation: turn the inputs into prompt token lists, and turn
generated tokens into SampledSequences whose ``new_input_feature`` is ready for training.

These are plain functions so that vLLMSampler, which only swaps the generation in the
middle, shares them, and so they are tested without any engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from twinkle.data_format import (
    InputFeature,
    Message,
    SampledSequence,
    SamplingParams,
    TopLogprobs,
)

IGNORE_INDEX = -100


def check_sampling_params(
    sampling_params: SamplingParams | Mapping[str, Any] | None, num_samples: int | None
) -> SamplingParams:
    """``sampling_params`` as SamplingParams (a dict is validated, as the client examples pass
    one), with ``num_samples`` (when given) replacing its own."""
    if sampling_params is None:
        raise ValueError("sample needs sampling_params, e.g. SamplingParams(max_tokens=256)")
    if isinstance(sampling_params, Mapping) and not isinstance(sampling_params, SamplingParams):
        sampling_params = SamplingParams(**sampling_params)
    if not isinstance(sampling_params, SamplingParams):
        raise TypeError(
            f"sampling_params must be SamplingParams or a dict, got "
            f"{type(sampling_params).__name__}"
        )
    if num_samples is not None:
        changed = {**sampling_params.to_dict(), "num_samples": num_samples}
        sampling_params = SamplingParams(**changed)
    return sampling_params


def as_prompt_features(inputs: Any, template: Any) -> list[InputFeature]:
    """Prompts as InputFeatures: features are kept, Trajectories (``messages`` without
    ``input_ids``) are encoded with ``add_generation_prompt=True``."""
    items = [inputs] if isinstance(inputs, Mapping) or hasattr(inputs, "keys") else list(inputs)
    if not items:
        raise ValueError("sample got no prompts: pass a non-empty list of InputFeatures")
    features: list[InputFeature | None] = [None] * len(items)
    to_encode: list[int] = []
    for index, item in enumerate(items):
        if "input_ids" in item:
            feature = item if isinstance(item, InputFeature) else InputFeature(**dict(item))
            if feature.length == 0:
                raise ValueError(f"prompt {index} has no tokens")
            features[index] = feature
        elif "messages" in item:
            to_encode.append(index)
        else:
            raise ValueError(
                f"prompt {index} has neither input_ids nor messages: pass InputFeatures "
                "(Template.encode(..., add_generation_prompt=True)) or Trajectories"
            )
    if to_encode:
        if template is None:
            raise ValueError(
                "these prompts are Trajectories (messages, no input_ids): call "
                "sampler.set_template(...) so the sampler can encode them"
            )
        encoded = template.batch_encode([items[i] for i in to_encode], add_generation_prompt=True)
        for index, feature in zip(to_encode, encoded, strict=True):
            if feature is None:
                raise ValueError(f"prompt {index} was dropped by the template's truncation")
            features[index] = feature
    return features  # type: ignore[return-value]


def prompt_token_ids(feature: InputFeature) -> list[int]:
    return np.asarray(feature.input_ids, dtype=np.int64).reshape(-1).tolist()


def completion_feature(
    prompt: InputFeature, prompt_ids: Sequence[int], tokens: Sequence[int], text: str
) -> InputFeature:
    """Prompt plus completion: labels are -100 on the prompt and the completion tokens on the
    completion (not shifted, as every InputFeature), and the messages end with the completion
    as an assistant turn, so rewards read it where they read any trajectory's reply."""
    input_ids = np.asarray([*prompt_ids, *tokens], dtype=np.int64)
    labels = np.full(len(input_ids), IGNORE_INDEX, dtype=np.int64)
    labels[len(prompt_ids) :] = tokens
    messages = [*(prompt.messages or []), Message(role="assistant", content=text)]
    return InputFeature(
        input_ids=input_ids,
        labels=labels,
        position_ids=np.arange(len(input_ids), dtype=np.int64),
        messages=messages,
        tools=prompt.tools,
        user_data=prompt.user_data,
    )


def sampled_sequence(
    prompt: InputFeature,
    prompt_ids: Sequence[int],
    tokens: Sequence[int],
    logprobs: list[TopLogprobs],
    stop_reason: str,
    text: str,
) -> SampledSequence:
    return SampledSequence(
        tokens=list(tokens),
        logprobs=logprobs,
        stop_reason=stop_reason,
        text=text,
        new_input_feature=completion_feature(prompt, prompt_ids, tokens, text),
    )
