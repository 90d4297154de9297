"""The model's batch methods dispatch a sampler's result over data-parallel Ray workers by
sequence, as its per-sequence loss arguments are cut (a pure function, no Ray needed)."""

import numpy as np
import torch

from twinkle.data_format import InputFeature, SampledSequence, SampleResponse
from twinkle.infra import dispatch
from twinkle.mesh import DeviceMesh
from twinkle.model.batch_dispatch import slice_dp_rows


def sequence(first_token: int) -> SampledSequence:
    completion = [first_token, first_token + 1]
    return SampledSequence(
        tokens=completion,
        logprobs=[[(t, -1.0)] for t in completion],
        stop_reason="length",
        new_input_feature=InputFeature(input_ids=[1, *completion], labels=[-100, *completion]),
    )


def test_three_prompts_of_two_samples_reach_two_workers_with_their_own_advantages():
    mesh = DeviceMesh.from_sizes(dp_size=2, device_type="cpu")
    responses = [
        SampleResponse(sequences=[sequence(10 * p), sequence(10 * p + 5)]) for p in (1, 2, 3)
    ]
    advantages = [float(s.tokens[0]) for r in responses for s in r.sequences]
    shares = [
        dispatch(slice_dp_rows, 2, i, (), {"inputs": responses, "advantages": advantages}, mesh)
        for i in range(2)
    ]
    for _, kwargs in shares:
        firsts = [int(f.input_ids[1]) for f in kwargs["inputs"]]
        assert firsts == kwargs["advantages"]  # each row beside its own advantage
    assert [len(kwargs["inputs"]) for _, kwargs in shares] == [3, 3]
    # Plain 'slice_dp' cuts the prompts (2 and 1) while the advantages go 3 and 3.
    plain = dispatch("slice_dp", 2, 0, (), {"inputs": responses, "advantages": advantages}, mesh)
    assert len(plain[1]["inputs"]) == 2 and len(plain[1]["advantages"]) == 3


def test_one_response_positionally_is_cut_too_and_features_pass_as_they_are():
    mesh = DeviceMesh.from_sizes(dp_size=2, device_type="cpu")
    response = SampleResponse(sequences=[sequence(10), sequence(20)])
    (inputs,), _ = dispatch(slice_dp_rows, 2, 1, (response,), {}, mesh)
    assert [int(f.input_ids[1]) for f in inputs] == [20]
    features = [s.new_input_feature for s in response.sequences]
    (inputs,), _ = dispatch(slice_dp_rows, 2, 0, (features,), {}, mesh)
    assert inputs == features[:1]


def test_a_collated_batch_of_tensors_is_cut_by_rows_as_arrays_are():
    mesh = DeviceMesh.from_sizes(dp_size=2, device_type="cpu")
    batch = {"input_ids": torch.arange(15).reshape(5, 3), "labels": np.arange(15).reshape(5, 3)}
    weights = torch.ones(5, 3)
    shares = [
        dispatch(
            slice_dp_rows, 2, i, (batch,), {"weights": weights, "scale": torch.tensor(2.0)}, mesh
        )
        for i in range(2)
    ]
    for (share,), kwargs in shares:
        assert share["input_ids"].tolist() == share["labels"].tolist()  # the same rows
        assert kwargs["weights"].shape[0] == share["input_ids"].shape[0]
        assert float(kwargs["scale"]) == 2.0  # a 0-d tensor goes whole
    assert [share["input_ids"].shape[0] for (share,), _ in shares] == [3, 2]
    joined = torch.cat([share["input_ids"] for (share,), _ in shares])
    assert torch.equal(joined, batch["input_ids"])
