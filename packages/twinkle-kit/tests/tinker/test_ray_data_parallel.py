"""The Tinker SDK trains against a ``mode: ray`` server whose model group has TWO data-parallel
workers: each runs its share of a request's datums, the model's ``collect='rows'`` joins every
worker's logprobs in datum order, and the step applies the gradient of the whole batch's loss
sum (DDP's reduction, then ``step_with(normalise=False)``).

The reference is the same model trained in this process, one worker, through the same
``model_ops`` functions with the same seeded LoRA weights: the per-datum logprobs, ``loss:sum``
and grad norms of every step agree within 1e-5 (float32 sums in another order). A one-datum
request leaves the second worker without rows: it still joins the gradient reduction.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np
import pytest
import tinker
from tinker import types

from twinkle.model.transformers.multi_lora import MultiLoraTransformersModel
from twinkle.server.tinker import model_ops
from twinkle.server.tinker.batch import build_batch
from twinkle.server.tinker.codec import TinkerDatum
from twinkle.server.tinker.losses import build_tinker_loss

LR, CLIP, RANK, SEED = 5e-3, 10.0, 8, 7
SEQUENCES = [
    [11, 12, 13, 14, 15, 16, 17, 18],
    [21, 22, 23, 24, 25, 26],
    [31, 32, 33, 34, 35, 36, 37],
]
WEIGHTS = [np.linspace(0.5, 1.5, len(s) - 1, dtype=np.float32) for s in SEQUENCES]
# 3 datums split 2 + 1 over the workers; 1 datum leaves the second worker idle.
STEPS = [[0, 1, 2], [0], [0, 1, 2], [2, 1], [0, 1, 2]]


def _datum(i: int) -> types.Datum:
    tokens = SEQUENCES[i]
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": np.asarray(tokens[1:], dtype=np.int64),
            "weights": WEIGHTS[i],
        },
    )


def _decoded(i: int) -> TinkerDatum:
    tokens = SEQUENCES[i]
    inputs = {"target_tokens": np.asarray(tokens[1:]), "weights": WEIGHTS[i]}
    return TinkerDatum(tokens[:-1], inputs)


class Reference:
    """The server's Tinker work on a one-process model: what a single worker computes."""

    def __init__(self, base_model: str) -> None:
        model = MultiLoraTransformersModel(base_model, max_loras=1, device="cpu")
        lora, seed = model_ops.tinker_lora_config({"rank": RANK, "seed": SEED}, 32)
        model.add_seeded_adapter("ref", lora, seed=seed)
        self.service = SimpleNamespace(model=model)
        model_ops.prepare_run(self.service, "ref")
        self.vocab, self.pad = model.vocab_size(), model.pad_token_id()

    def forward_backward(self, rows: list[int], forward_only: bool) -> tuple[list, float]:
        batch, loss_inputs, lengths = build_batch([_decoded(i) for i in rows], self.vocab, self.pad)
        outputs, metrics = model_ops.forward_backward(
            self.service,
            "ref",
            batch,
            loss_inputs,
            lengths,
            build_tinker_loss("cross_entropy"),
            forward_only,
        )
        return [o["logprobs"] for o in outputs], metrics["loss:sum"]

    def optim_step(self) -> float:
        params = model_ops.adam_params({"learning_rate": LR, "grad_clip_norm": CLIP})
        return model_ops.optim_step(self.service, "ref", params)["grad_norm:mean"]


@pytest.fixture(scope="module")
def two_worker_server(server_process, base_model) -> Iterator[tuple[str, str]]:
    server = server_process(
        "tinker_dp_home",
        {
            "mode": "ray",
            "model": {"model_id": base_model, "max_loras": 2, "device": "cpu"},
            "sampler": {"enabled": False},
            "device_groups": [{"name": "model", "ranks": 2, "device_type": "cpu"}],
            "ray_init_kwargs": {"num_cpus": 3, "include_dashboard": False},
        },
        ray=True,
    )
    key = server.cli("keys", "create", "--name", "dp")
    server.start(timeout_s=240)
    yield server.url, key
    server.stop(timeout_s=60)


def _logprobs(result: types.ForwardBackwardOutput) -> list[np.ndarray]:
    return [o["logprobs"].to_numpy() for o in result.loss_fn_outputs]


def test_two_workers_train_as_one(two_worker_server, base_model):
    url, key = two_worker_server
    reference = Reference(base_model)
    with tinker.ServiceClient(base_url=url, api_key=key) as service:
        client = service.create_lora_training_client(base_model=base_model, rank=RANK, seed=SEED)
        client = client.result(timeout=120)
        losses = []
        for rows in STEPS:
            result = client.forward_backward([_datum(i) for i in rows], "cross_entropy")
            optim = client.optim_step(types.AdamParams(learning_rate=LR, grad_clip_norm=CLIP))
            result = result.result(timeout=120)
            norm = optim.result(timeout=120).metrics["grad_norm:mean"]
            expected, expected_loss = reference.forward_backward(rows, forward_only=False)
            got = _logprobs(result)
            assert [len(g) for g in got] == [len(SEQUENCES[i]) - 1 for i in rows]
            for g, e in zip(got, expected, strict=True):
                np.testing.assert_allclose(g, e, atol=1e-5)
            loss = result.metrics["loss:sum"]
            weighted = -sum(float((g * WEIGHTS[i]).sum()) for g, i in zip(got, rows, strict=True))
            assert loss == pytest.approx(weighted, rel=1e-5)
            assert loss == pytest.approx(expected_loss, rel=1e-5)
            assert norm == pytest.approx(reference.optim_step(), rel=1e-4)
            if len(rows) == 3:
                losses.append(loss)
        assert losses[0] > losses[1] > losses[2], losses  # the whole batch's loss falls

        # forward (no gradients) of one datum: the idle worker returns no rows.
        forward = client.forward([_datum(1)], "cross_entropy").result(timeout=120)
        expected, _ = reference.forward_backward([1], forward_only=True)
        np.testing.assert_allclose(_logprobs(forward)[0], expected[0], atol=1e-5)
