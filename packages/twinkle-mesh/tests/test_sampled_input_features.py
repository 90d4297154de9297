"""``sampled_input_features``: a sampler's result, in every form the documents pass it to
``forward_backward(inputs=...)``, as its sequences' ``new_input_feature``s in order."""

import pytest

from twinkle.data_format import (
    InputFeature,
    SampledSequence,
    SampleResponse,
    sampled_input_features,
)


def sequence(prompt: list[int], completion: list[int]) -> SampledSequence:
    ids = [*prompt, *completion]
    labels = [-100] * len(prompt) + completion
    return SampledSequence(
        tokens=completion,
        logprobs=[[(token, -1.0)] for token in completion],
        stop_reason="length",
        new_input_feature=InputFeature(input_ids=ids, labels=labels),
    )


@pytest.fixture
def responses() -> list[SampleResponse]:
    return [
        SampleResponse(sequences=[sequence([1, 2], [3, 4]), sequence([1, 2], [5])]),
        SampleResponse(sequences=[sequence([7], [8, 9, 10])]),
    ]


def ids(features) -> list[list[int]]:
    return [f.input_ids.tolist() for f in features]


def test_every_form_of_a_samplers_result_gives_its_features_in_order(responses):
    expected = [[1, 2, 3, 4], [1, 2, 5], [7, 8, 9, 10]]
    flat = [s for r in responses for s in r.sequences]
    remote = {"sequences": flat, "responses": responses}  # what twinkle_client's sampler returns
    as_json = {"sequences": [s.to_dict() for s in flat]}
    for form in (responses, flat, remote, as_json):
        assert ids(sampled_input_features(form)) == expected
    assert ids(sampled_input_features(responses[1])) == [[7, 8, 9, 10]]
    assert ids(sampled_input_features(flat[0])) == [[1, 2, 3, 4]]


def test_plain_inputs_are_not_a_samplers_result(responses):
    feature = responses[0].sequences[0].new_input_feature
    trajectory = {"messages": [{"role": "user", "content": "hi"}]}
    for plain in ([feature], feature, [trajectory], trajectory, {"input_ids": [1, 2]}, []):
        assert sampled_input_features(plain) is None


def test_a_sequence_without_its_feature_says_what_to_pass(responses):
    bare = SampledSequence(tokens=[3], logprobs=[[(3, -1.0)]], stop_reason="stop")
    with pytest.raises(ValueError, match=r"sequence 1 of the sampler's result has no new_inp"):
        sampled_input_features([responses[0].sequences[0], bare])
