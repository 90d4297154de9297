"""Twinkle InputFeature <-> Tinker Datum, so Twinkle datasets feed Tinker training clients.

The two formats align their targets differently. An InputFeature's ``labels`` are NOT
shifted (``labels[i]`` is predicted from the logits at ``i - 1``, -100 outside the loss);
a Datum's ``target_tokens[i]`` is predicted at position ``i`` of its ``model_input``. So a
feature of N tokens becomes a datum of N - 1:

    model_input   = input_ids[:-1]
    target_tokens = labels[1:]  (input_ids[1:] where the label is -100)
    weights       = 1.0 where labels[1:] != -100, else 0.0

The SDK (``tinker``) is imported only when called: the server itself never needs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from twinkle.data_format import InputFeature

IGNORE_INDEX = -100


def _tinker_types() -> Any:
    try:
        from tinker import types
    except ImportError as exc:
        raise ImportError(
            "the Tinker SDK is not installed; input_feature_to_datum builds tinker.types.Datum: "
            "pip install twinkle-client[tinker]"
        ) from exc
    return types


def _tokens(value: Any, name: str) -> np.ndarray:
    array = np.asarray(value.cpu() if hasattr(value, "cpu") else value)
    if array.ndim == 2 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 1:
        raise ValueError(
            f"{name} must be one sequence (1-D), got shape {array.shape}; "
            "convert the features of a batch one by one"
        )
    return array.astype(np.int64)


def input_feature_to_datum(feature: InputFeature | Mapping[str, Any]) -> Any:
    """One encoded feature (``Template.encode`` output) as a cross_entropy tinker Datum."""
    types = _tinker_types()
    if not isinstance(feature, InputFeature):
        feature = InputFeature.model_validate(dict(feature))
    if feature.labels is None:
        raise ValueError(
            "the feature has no labels, so there is nothing to train on; encode it with a "
            "Template (dataset.set_template(...); dataset.encode()) or set labels (-100 = ignore)"
        )
    input_ids = _tokens(feature.input_ids, "input_ids")
    labels = _tokens(feature.labels, "labels")
    if len(input_ids) < 2:
        raise ValueError(
            f"the feature has {len(input_ids)} token(s); a datum needs at least 2 (an input and "
            "the token it predicts)"
        )
    trained = labels[1:] != IGNORE_INDEX
    targets = np.where(trained, labels[1:], input_ids[1:])
    n = len(targets)
    return types.Datum(
        model_input=types.ModelInput.from_ints(input_ids[:-1].tolist()),
        loss_fn_inputs={
            "target_tokens": types.TensorData(data=targets.tolist(), dtype="int64", shape=[n]),
            "weights": types.TensorData(
                data=trained.astype(np.float32).tolist(), dtype="float32", shape=[n]
            ),
        },
    )


def datum_to_input_feature(datum: Any) -> InputFeature:
    """A cross_entropy ``tinker.types.Datum`` back as an InputFeature: the inverse of
    ``input_feature_to_datum`` for features whose trained labels copy their input_ids.

    Only ``target_tokens`` and ``weights`` (all ones when absent) are read. Labels can only
    say "trained or not", so weights other than 0 and 1 are refused rather than rounded.
    """
    tokens = np.asarray(datum.model_input.to_ints(), dtype=np.int64)
    inputs = datum.loss_fn_inputs
    if "target_tokens" not in inputs:
        raise ValueError("the datum has no loss_fn_inputs['target_tokens'] to turn into labels")
    targets = np.asarray(inputs["target_tokens"].to_numpy(), dtype=np.int64).reshape(-1)
    if len(targets) != len(tokens) or len(tokens) == 0:
        raise ValueError(
            f"target_tokens has {len(targets)} entries but model_input has {len(tokens)} "
            "tokens; a datum predicts one target per input position"
        )
    weights = (
        np.asarray(inputs["weights"].to_numpy(), dtype=np.float32).reshape(-1)
        if "weights" in inputs
        else np.ones(len(targets), dtype=np.float32)
    )
    if not np.isin(weights, (0.0, 1.0)).all():
        raise ValueError(
            "weights other than 0 and 1 have no InputFeature form (labels only mark tokens "
            "as trained or ignored); send such a datum to the Tinker client as is"
        )
    labels = np.where(weights != 0, targets, IGNORE_INDEX)
    return InputFeature(
        input_ids=np.concatenate([tokens, targets[-1:]]),
        labels=np.concatenate([[IGNORE_INDEX], labels]).astype(np.int64),
    )
