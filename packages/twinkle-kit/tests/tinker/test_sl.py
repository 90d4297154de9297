"""The supervised loop through the unmodified Tinker SDK against a real twinkle-server.

Covers the documents' Tinker SFT example: create a LoRA training client, forward_backward
with cross_entropy, optim_step, watch the loss fall; save_state and resume with
create_training_client_from_state_with_optimizer (the resumed client continues exactly like
the original); forward (forward-only logprobs); forward_backward_custom (a client-side loss
sent back as cross_entropy weights); and the run is one record for both APIs.
"""

from __future__ import annotations

import numpy as np
import pytest
import tinker
from tinker import types

LR = 5e-3
SEQUENCES = [
    [11, 12, 13, 14, 15, 16, 17, 18],
    [21, 22, 23, 24, 25, 26],
    [31, 32, 33, 34, 35, 36, 37],
]


def datum(tokens: list[int], weights: list[float] | None = None) -> types.Datum:
    """Next-token prediction on ``tokens``: inputs t[:-1], targets t[1:]."""
    targets = tokens[1:]
    weights = weights if weights is not None else [1.0] * len(targets)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": np.asarray(targets, dtype=np.int64),
            "weights": np.asarray(weights, dtype=np.float32),
        },
    )


DATA = [datum(s) for s in SEQUENCES]


def train_step(client, data=DATA) -> tuple[float, types.ForwardBackwardOutput]:
    fwdbwd = client.forward_backward(data, "cross_entropy")
    optim = client.optim_step(types.AdamParams(learning_rate=LR))
    result = fwdbwd.result(timeout=120)
    optim.result(timeout=120)
    return result.metrics["loss:sum"], result


def test_sl_loop_loss_falls(service, base_model):
    client = service.create_lora_training_client(base_model=base_model, rank=8).result(timeout=120)
    assert client.model_id.endswith(":train:0")
    losses = []
    for _ in range(6):
        loss, result = train_step(client)
        losses.append(loss)
    # loss:sum is the cross-entropy SUM: it equals -sum(weights * logprobs) of the outputs.
    logprobs = np.concatenate([o["logprobs"].to_numpy() for o in result.loss_fn_outputs])
    assert len(result.loss_fn_outputs) == len(DATA)
    assert [o["logprobs"].to_numpy().shape[0] for o in result.loss_fn_outputs] == [
        len(s) - 1 for s in SEQUENCES
    ]
    assert loss == pytest.approx(-logprobs.sum(), rel=1e-4)
    assert losses[-1] < 0.8 * losses[0]


def test_weights_scale_the_sum_and_forward_changes_nothing(service, base_model):
    """cross_entropy is -sum(w * logp), any real w; forward() returns logprobs and trains
    nothing (two forwards agree to 1e-6)."""
    client = service.create_lora_training_client(base_model=base_model, rank=4).result(timeout=120)
    tokens = SEQUENCES[0]
    weights = [2.0, -1.0, 0.0, 0.5, 1.0, 1.0, 3.0]
    first = client.forward([datum(tokens, weights)], "cross_entropy").result(timeout=120)
    second = client.forward([datum(tokens, weights)], "cross_entropy").result(timeout=120)
    logprobs = first.loss_fn_outputs[0]["logprobs"].to_numpy()
    assert np.all(logprobs < 0)
    expected = -float(np.dot(weights, logprobs))
    assert first.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4, abs=1e-5)
    np.testing.assert_allclose(
        second.loss_fn_outputs[0]["logprobs"].to_numpy(), logprobs, atol=1e-6
    )


def test_save_state_and_resume_with_optimizer(service, base_model):
    """The resumed client and the original take the same next step: same loss (1e-5)."""
    client = service.create_lora_training_client(base_model=base_model, rank=8).result(timeout=120)
    for _ in range(2):
        train_step(client)
    path = client.save_state("resume-me").result(timeout=120).path
    assert path == f"tinker://{client.model_id}/weights/resume-me"
    resumed = service.create_training_client_from_state_with_optimizer(path).result(timeout=120)
    assert resumed.model_id != client.model_id
    original_losses = [train_step(client)[0] for _ in range(2)]
    resumed_losses = [train_step(resumed)[0] for _ in range(2)]
    np.testing.assert_allclose(resumed_losses, original_losses, rtol=1e-5)


def test_load_state_into_a_running_client(service, base_model):
    """load_state (weights only) puts the saved weights back: the loss at the save returns."""
    client = service.create_lora_training_client(base_model=base_model, rank=4).result(timeout=120)
    train_step(client)
    path = client.save_state("before").result(timeout=120).path
    at_save = client.forward(DATA, "cross_entropy").result(timeout=120).metrics["loss:sum"]
    for _ in range(3):
        train_step(client)
    moved = client.forward(DATA, "cross_entropy").result(timeout=120).metrics["loss:sum"]
    assert moved < at_save
    client.load_state(path).result(timeout=120)
    back = client.forward(DATA, "cross_entropy").result(timeout=120).metrics["loss:sum"]
    assert back == pytest.approx(at_save, rel=1e-5)


def test_forward_backward_custom(service, base_model):
    """A client-side loss: the SDK sends its gradient as cross_entropy weights. The loss
    -2 * sum(logp) trains like cross_entropy with weights 2."""
    import torch

    client = service.create_lora_training_client(base_model=base_model, rank=4).result(timeout=120)

    def doubled_nll(data, logprobs_list):
        loss = -2.0 * sum(lp.sum() for lp in logprobs_list)
        return loss, {"doubled_nll": float(loss.detach())}

    result = client.forward_backward_custom(DATA, doubled_nll).result(timeout=120)
    reference = client.forward(DATA, "cross_entropy").result(timeout=120)
    assert result.metrics["doubled_nll"] == pytest.approx(
        2 * reference.metrics["loss:sum"], rel=1e-4
    )
    assert torch.is_tensor(torch.as_tensor(result.loss_fn_outputs[0]["logprobs"].to_numpy()))


def test_the_run_is_visible_to_the_rest_client(service, base_model, tinker_server):
    client = service.create_lora_training_client(base_model=base_model, rank=4).result(timeout=120)
    train_step(client)
    rest = tinker.RestClient(base_url=tinker_server.base_url, api_key=tinker_server.key_a)
    run = rest.get_training_run(client.model_id).result(timeout=60)
    assert run.training_run_id == client.model_id
    assert run.base_model == base_model
    assert run.lora_rank == 4
    sampler_path = client.save_weights_for_sampler("for-sampling").result(timeout=120).path
    assert sampler_path == f"tinker://{client.model_id}/sampler_weights/for-sampling"
    listed = rest.list_checkpoints(client.model_id).result(timeout=60).checkpoints
    assert [(c.checkpoint_id, c.checkpoint_type) for c in listed] == [
        ("sampler_weights/for-sampling", "sampler")
    ]
    info = client.get_info()
    assert info.model_data.model_name == base_model
    tokenizer = client.get_tokenizer()  # loaded by the SDK from get_info's tokenizer_id
    ids = tokenizer.encode("hello world", add_special_tokens=False)
    assert ids and tokenizer.decode(ids) == "hello world"


def test_save_weights_and_get_sampling_client_sees_the_trained_weights(service, base_model):
    """The ephemeral save registers a sampler on the weights as they are now: its prompt
    logprobs equal the trainer's forward logprobs (to 1e-4) after training moved them."""
    client = service.create_lora_training_client(base_model=base_model, rank=4).result(timeout=120)
    for _ in range(2):
        train_step(client)
    sampling = client.save_weights_and_get_sampling_client().result(timeout=120)
    tokens = SEQUENCES[0]
    prompt = types.ModelInput.from_ints(tokens)
    sampled = sampling.compute_logprobs(prompt).result(timeout=120)
    trained = client.forward([datum(tokens)], "cross_entropy").result(timeout=120)
    trainer_logprobs = trained.loss_fn_outputs[0]["logprobs"].to_numpy()
    assert sampled[0] is None
    np.testing.assert_allclose(np.asarray(sampled[1:]), trainer_logprobs, atol=1e-4)


def test_chunked_forward_backward_runs_before_the_next_step(service, base_model):
    """Over the server's row limit (limits.max_batch_rows, 256, which client/config gives the
    SDK as its chunk size) the SDK splits forward_backward into chunks with their own seq_ids,
    sent concurrently, and joins their outputs. Each chunk's outputs come back in request
    order and all run before the optim_step: the joined logprobs equal a forward taken
    before (to 1e-5), though the step moves them. (The reorder buffer itself is checked in
    twinkle-server's test_tinker_ordering.py and test_tinker_training.py, where the arrival
    order is controlled.)"""
    client = service.create_lora_training_client(base_model=base_model, rank=4).result(timeout=120)
    rng = np.random.default_rng(0)
    many = [datum([int(t) for t in rng.integers(10, 200, size=4)]) for _ in range(1100)]
    before = client.forward(many, "cross_entropy").result(timeout=300)
    fwdbwd = client.forward_backward(many, "cross_entropy")
    optim = client.optim_step(types.AdamParams(learning_rate=0.05))
    chunked = fwdbwd.result(timeout=300)
    optim.result(timeout=300)
    after = client.forward(many[:4], "cross_entropy").result(timeout=120)

    def logprobs(output, n=None):
        rows = output.loss_fn_outputs[:n] if n else output.loss_fn_outputs
        return np.concatenate([o["logprobs"].to_numpy() for o in rows])

    assert len(chunked.loss_fn_outputs) == len(many)
    np.testing.assert_allclose(logprobs(chunked), logprobs(before), atol=1e-5)
    assert chunked.metrics["loss:sum"] == pytest.approx(before.metrics["loss:sum"], rel=1e-5)
    assert np.abs(logprobs(after) - logprobs(before, 4)).max() > 1e-3
