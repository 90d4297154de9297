"""The sampler's ragged per-completion lists (old_logps, per-token advantages) meet the model's
label positions exactly: an off-by-one would silently train the neighbouring token.

The trainer and the sampler start from the same weights, so the batch is on-policy: every
ratio is 1 and the GRPO gradient is ``-sum_t A_t * grad logp_t``. Putting the advantage on one
completion token must give exactly the gradient of that token's log-probability, computed
here by hand from the logits that predict it (float32 sums in another order: the tolerance of
``reduction_tolerance``, relative to each tensor's largest entry for the entries near zero).
"""

import copy

import torch

from twinkle.data_format import SamplingParams
from twinkle.model import TransformersModel
from twinkle.utils.testing import reduction_tolerance

MODEL_ID = "bundled://tiny-qwen3"
VOCAB = 3909  # the bundled tokenizer's vocabulary: the longest sum of the log-softmax
PROMPTS = [
    {"messages": [{"role": "user", "content": "What is 2 + 3?"}]},
    {"messages": [{"role": "user", "content": "Name a colour, please."}]},
]


def test_a_per_token_advantage_trains_exactly_that_token(sampler):
    responses = sampler.sample(PROMPTS, SamplingParams(max_tokens=8, seed=3), num_samples=2)
    seqs = [s for r in responses for s in r.sequences]
    model = TransformersModel(model_id=MODEL_ID)
    model.set_loss("GRPOLoss", epsilon=0.2)
    reference = copy.deepcopy(model.model)

    row, k = 2, 3  # the fourth completion token of the third sequence
    advantages = [[0.0] * len(s.tokens) for s in seqs]
    advantages[row][k] = 1.0
    old_logps = [[p[0][1] for p in s.logprobs] for s in seqs]
    model.forward_backward(
        inputs=[s.new_input_feature for s in seqs], old_logps=old_logps, advantages=advantages
    )
    metrics = model.calculate_metric()
    assert metrics["policy/logp_mismatch"] < 1e-5  # ratios are 1: the lists are aligned
    assert metrics["policy/clip_fraction"] == 0

    feature = seqs[row].new_input_feature
    ids = torch.as_tensor(feature.input_ids)[None]
    position = len(ids[0]) - len(seqs[row].tokens) + k  # where token k sits in the row
    logits = reference(input_ids=ids).logits[0, position - 1]
    (-logits.log_softmax(-1)[ids[0, position]]).backward()
    for (name, ours), theirs in zip(
        model.model.named_parameters(), reference.parameters(), strict=True
    ):
        # The model runs the four rows as one padded batch, the reference one row alone: float32
        # sums in another order (the longest over the vocabulary), far below an off-by-one's change.
        tol = reduction_tolerance(theirs.grad, terms=VOCAB)
        torch.testing.assert_close(ours.grad, theirs.grad, **tol, msg=lambda m, n=name: f"{n}: {m}")


def test_per_sequence_advantages_weigh_every_completion_token(sampler):
    """One advantage per sequence: the gradient is A_i times the gradient of the sequence's
    summed completion logps (the model pads the two rows into one batch, the reference runs
    them one by one: float32 sums in another order)."""
    responses = sampler.sample(PROMPTS, SamplingParams(max_tokens=6, seed=5))
    seqs = [s for r in responses for s in r.sequences]
    model = TransformersModel(model_id=MODEL_ID)
    model.set_loss("GRPOLoss")
    reference = copy.deepcopy(model.model)
    model.forward_backward(
        inputs=[s.new_input_feature for s in seqs],
        old_logps=[[p[0][1] for p in s.logprobs] for s in seqs],
        advantages=[2.0, -1.0],
    )
    total = 0.0
    for advantage, seq in zip([2.0, -1.0], seqs, strict=True):
        ids = torch.as_tensor(seq.new_input_feature.input_ids)[None]
        start = len(ids[0]) - len(seq.tokens)
        logps = reference(input_ids=ids).logits[0, start - 1 : -1].log_softmax(-1)
        total = total - advantage * logps.gather(-1, ids[0, start:, None]).sum()
    total.backward()
    for ours, theirs in zip(model.model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(
            ours.grad, theirs.grad, **reduction_tolerance(theirs.grad, terms=VOCAB)
        )
