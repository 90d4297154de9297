"""input_feature_to_datum / datum_to_input_feature with the real SDK types (no server).

The one thing that is easy to get wrong is the off-by-one: an InputFeature's labels are
not shifted, a Datum's target_tokens are. These tests pin the exact alignment.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto

from twinkle.data_format import InputFeature
from twinkle.server.common import datum_to_input_feature, input_feature_to_datum

FEATURE = InputFeature(input_ids=[10, 11, 12, 13, 14], labels=[-100, -100, 12, 13, 14])


def _lists(datum: types.Datum) -> tuple[list[int], list[int], list[float]]:
    inputs = datum.loss_fn_inputs
    return (
        datum.model_input.to_ints(),
        inputs["target_tokens"].tolist(),
        inputs["weights"].tolist(),
    )


def test_targets_are_the_labels_shifted_left_and_weighted_where_trained():
    tokens, targets, weights = _lists(input_feature_to_datum(FEATURE))
    assert tokens == [10, 11, 12, 13]
    assert targets == [11, 12, 13, 14]  # target i is predicted at input position i
    assert weights == [0.0, 1.0, 1.0, 1.0]
    datum = input_feature_to_datum(FEATURE)
    assert datum.loss_fn_inputs["target_tokens"].dtype == "int64"
    assert datum.loss_fn_inputs["weights"].dtype == "float32"


def test_a_masked_label_keeps_a_valid_target_token_with_zero_weight():
    feature = InputFeature(input_ids=[7, 8, 9, 10], labels=[-100, 8, -100, 10])
    _, targets, weights = _lists(input_feature_to_datum(feature))
    assert targets == [8, 9, 10] and weights == [1.0, 0.0, 1.0]


@pytest.mark.parametrize(
    "feature",
    [
        FEATURE,
        InputFeature(input_ids=[1, 2], labels=[-100, 2]),
        InputFeature(input_ids=[4, 5, 6, 7], labels=[-100, 5, -100, -100]),
    ],
)
def test_datum_to_input_feature_inverts_it(feature):
    back = datum_to_input_feature(input_feature_to_datum(feature))
    np.testing.assert_array_equal(back.input_ids, feature.input_ids)
    np.testing.assert_array_equal(back.labels, feature.labels)


def test_dicts_tensors_and_a_batch_of_one_are_accepted():
    as_dict = {"input_ids": [10, 11, 12, 13, 14], "labels": [-100, -100, 12, 13, 14]}
    as_tensors = InputFeature(
        input_ids=torch.tensor([[10, 11, 12, 13, 14]]),
        labels=torch.tensor([[-100, -100, 12, 13, 14]]),
    )
    expected = _lists(input_feature_to_datum(FEATURE))
    assert _lists(input_feature_to_datum(as_dict)) == expected
    assert _lists(input_feature_to_datum(as_tensors)) == expected


@pytest.mark.parametrize(
    ("feature", "message"),
    [
        (InputFeature(input_ids=[1, 2, 3]), "no labels"),
        (InputFeature(input_ids=[1], labels=[1]), "at least 2"),
        (
            InputFeature(input_ids=[[1, 2, 3], [4, 5, 6]], labels=[[1, 2, 3], [4, 5, 6]]),
            "one by one",
        ),
    ],
)
def test_features_that_make_no_datum_are_refused_clearly(feature, message):
    with pytest.raises(ValueError, match=message):
        input_feature_to_datum(feature)


def test_datums_without_an_input_feature_form_are_refused_clearly():
    fractional = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2]),
        loss_fn_inputs={
            "target_tokens": types.TensorData(data=[2, 3], dtype="int64", shape=[2]),
            "weights": types.TensorData(data=[0.5, -1.0], dtype="float32", shape=[2]),
        },
    )
    with pytest.raises(ValueError, match="weights other than 0 and 1"):
        datum_to_input_feature(fractional)
    misaligned = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2, 3]),
        loss_fn_inputs={"target_tokens": types.TensorData(data=[2], dtype="int64", shape=[1])},
    )
    with pytest.raises(ValueError, match="target_tokens has 1 entries but model_input has 3"):
        datum_to_input_feature(misaligned)


def test_missing_sdk_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "tinker", None)
    with pytest.raises(ImportError, match=r"pip install twinkle-client\[tinker\]"):
        input_feature_to_datum(FEATURE)


def test_the_documents_dataset_pipeline_feeds_the_sdk_serializer():
    """The documents' loop: Dataset -> Template -> DataLoader -> datums -> the SDK's wire form."""
    from twinkle.dataloader import DataLoader
    from twinkle.dataset import Dataset, DatasetMeta
    from twinkle.preprocessor import SelfCognitionProcessor

    dataset = Dataset(dataset_meta=DatasetMeta("bundled://self-cognition", data_slice=range(4)))
    dataset.set_template("Template", model_id="bundled://tiny-qwen3", max_length=64)
    dataset.map(SelfCognitionProcessor("tw", "us"), load_from_cache_file=False)
    dataset.encode(batched=True, load_from_cache_file=False)
    batch = next(iter(DataLoader(dataset=dataset, batch_size=2)))
    data = [input_feature_to_datum(feature) for feature in batch]
    assert len(data) == 2
    for feature, datum in zip(batch, data, strict=True):
        tokens, targets, weights = _lists(datum)
        assert tokens == feature.input_ids[:-1].tolist()
        trained = np.asarray(weights) == 1.0
        np.testing.assert_array_equal(np.asarray(targets)[trained], feature.labels[1:][trained])
        assert trained.any() and not trained.all()  # the prompt is not trained, the answer is
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn="cross_entropy"),
        model_id="m",
        seq_id=1,
    )
    proto = forward_backward_request_to_proto(request)
    assert len(proto.data) == 2 and proto.loss_fn == "cross_entropy"
