"""A sampler's results in the shapes the documents pass them to ``forward_backward``.

* The Ray GRPO sample: ``old_logps`` as ``[logprob[0][1] for logprob in sequence.logprobs]``,
  with ``micro_batch_size``.
* The Twinkle-client GRPO sample: ``old_logps`` as ``seq.get('logprobs', [])``, the sampler's
  own per-token ``(token_id, logprob)`` lists; inputs as ``seq.get('new_input_feature', seq)``.
* The run-modes page's HTTP sketch: ``forward_backward(inputs=responses, ...)`` with the
  sampler's result itself.

The trainer and the sampler start from the same weights, so the sampler's logprobs must
match the trainer's at every completion token (the policy metric's mismatch, mean
|logp - old_logp|, near 0): the values reach the right positions. Both shapes pass through
one normalisation (``twinkle.loss.align_to_labels``), so they train identically.
"""

import pytest
import torch

from twinkle.data_format import SamplingParams
from twinkle.model import TransformersModel

MODEL_ID = "bundled://tiny-qwen3"
NUM_GENERATIONS = 2
MICRO_BATCH_SIZE = 2
PROMPTS = [
    {"messages": [{"role": "user", "content": "What is 2 + 3?"}]},
    {"messages": [{"role": "user", "content": "Name a colour, please."}]},
]


@pytest.fixture(scope="module")
def sample_responses(sampler):
    # As the Ray sample samples (sizes changed): one SampleResponse per prompt.
    sampling_params = SamplingParams(max_tokens=6, num_samples=1, logprobs=1, seed=11)
    global_prompts = PROMPTS
    return sampler.sample(global_prompts * NUM_GENERATIONS, sampling_params)


def grpo_model() -> TransformersModel:
    model = TransformersModel(model_id=MODEL_ID)
    model.set_loss("GRPOLoss", epsilon=0.2)
    return model


def gradients(model: TransformersModel) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.model.parameters()]


def ray_sample_inputs(sample_responses):
    """The Ray GRPO sample's loop, as written."""
    all_input_data = []
    all_old_logps = []
    for sample_response in sample_responses:
        for sequence in sample_response.sequences:
            all_input_data.append(sequence.new_input_feature)
            all_old_logps.append([logprob[0][1] for logprob in sequence.logprobs])
    return all_input_data, all_old_logps


def client_sample_inputs(sample_responses):
    """The Twinkle-client GRPO sample's loop, as written, over each prompt's response."""
    input_features = []
    old_logps_list = []
    for sample_response in sample_responses:
        sequences = sample_response.get("sequences", [])
        for seq in sequences:
            input_features.append(seq.get("new_input_feature", seq))
            old_logps_list.append(seq.get("logprobs", []))
    return input_features, old_logps_list


def test_both_documented_old_logps_shapes_train_alike_and_line_up(sample_responses):
    advantages = [1.0, -1.0, 0.5, -0.5]
    ray_inputs, ray_old = ray_sample_inputs(sample_responses)
    client_inputs, client_old = client_sample_inputs(sample_responses)
    assert isinstance(client_old[0][0][0], tuple)  # the sampler's (token_id, logprob) pairs

    results = []
    for inputs, old in ((ray_inputs, ray_old), (client_inputs, client_old)):
        model = grpo_model()
        output = model.forward_backward(
            inputs=inputs,
            old_logps=old,
            advantages=advantages,
            micro_batch_size=MICRO_BATCH_SIZE,
        )
        metrics = model.calculate_metric(is_training=True)
        assert metrics["policy/logp_mismatch"] < 1e-4, metrics  # aligned with the labels
        results.append((output.loss, gradients(model)))
    (ray_loss, ray_grads), (client_loss, client_grads) = results
    assert client_loss == ray_loss
    for ours, theirs in zip(client_grads, ray_grads, strict=True):
        assert torch.equal(ours, theirs)


def test_a_mismatched_row_is_named_with_both_lengths(sample_responses):
    inputs, old = client_sample_inputs(sample_responses)
    model = grpo_model()
    short = [*old[:3], old[3][:-1]]  # row 3 lies in the second micro-batch: named as row 3
    n = len(old[3])
    with pytest.raises(
        ValueError, match=rf"old_logps\[3\] has {n - 1} values but row 3 of the batch has {n}"
    ):
        model.forward_backward(
            inputs=inputs, old_logps=short, advantages=[1.0] * 4, micro_batch_size=2
        )
    with pytest.raises(ValueError, match=r"list of one row per sequence \(4 rows .*got 3"):
        model.forward_backward(inputs=inputs, old_logps=old[:3], advantages=[1.0] * 4)


def test_wrong_nesting_and_another_sequences_logprobs_are_refused(sample_responses):
    inputs, old = client_sample_inputs(sample_responses)
    model = grpo_model()
    nested = [[[[pairs]] for pairs in row] for row in old]  # one level too deep
    with pytest.raises(ValueError, match=r"old_logps\[0\]\[0\] is .*\(token_id, logprob\) pairs"):
        model.forward_backward(inputs=inputs, old_logps=nested, advantages=[1.0] * 4)
    # Row 0 given the logprobs of row 1 (same length, other tokens): the tokens tell.
    swapped = [old[1], old[0], *old[2:]]
    assert [p[0][0] for p in old[0]] != [p[0][0] for p in old[1]]
    assert len(old[0]) == len(old[1])
    with pytest.raises(ValueError, match=r"old_logps\[0\] holds the sampler's logprobs of other"):
        model.forward_backward(inputs=inputs, old_logps=swapped, advantages=[1.0] * 4)


def test_forward_backward_takes_the_samplers_result_as_inputs(sample_responses):
    """The run-modes page's ``model.forward_backward(inputs=responses, advantages=...)``."""
    advantages = [1.0, -1.0, 0.5, -0.5]
    features, _ = ray_sample_inputs(sample_responses)
    expected = grpo_model()
    want = expected.forward_backward(inputs=features, advantages=advantages)

    model = grpo_model()
    responses = sample_responses
    output = model.forward_backward(inputs=responses, advantages=advantages)
    assert output.loss == want.loss and output.num_tokens == want.num_tokens
    for ours, theirs in zip(gradients(model), gradients(expected), strict=True):
        assert torch.equal(ours, theirs)

    one = grpo_model().forward_backward(inputs=responses[0], advantages=advantages[:1])
    alone = grpo_model().forward_backward(inputs=features[:1], advantages=advantages[:1])
    assert one.loss == alone.loss and one.num_tokens == alone.num_tokens
