"""What the Tinker routes ask of the model, all through its remote functions so that
``mode: ray``/``http`` serve them as ``embedded`` does (the SDK against a Ray server runs in
twinkle-kit's tests/tinker/test_ray_mode.py): the vocabulary size, pad id and model folder
asked once, seeded LoRA weights, and the outputs of several data-parallel workers joined
back into every datum's (the SDK against two real workers: tests/tinker/test_ray_data_parallel.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from twinkle.infra.collect import collect
from twinkle.infra.dispatch import dispatch
from twinkle.infra.remote import find_remote_spec
from twinkle.mesh import DeviceMesh
from twinkle.utils.testing import reduction_tolerance

TOKENS = [5, 9, 17, 33, 2, 40]
VOCAB = 3909  # the tiny model's vocabulary: the longest sum of a logprob


def _fwd_body(model_id: str, seq_id: int, datums: int = 1) -> dict:
    def tensor(values, dtype):
        return {"data": list(values), "dtype": dtype}

    def datum(i: int) -> dict:
        tokens = TOKENS[: len(TOKENS) - i]  # rows of different lengths: padding in the batch
        return {
            "model_input": {"chunks": [{"tokens": tokens[:-1]}]},
            "loss_fn_inputs": {
                "target_tokens": tensor(tokens[1:], "int64"),
                "weights": tensor([1.0 + i] * (len(tokens) - 1), "float32"),
            },
        }

    payload = {"data": [datum(i) for i in range(datums)], "loss_fn": "cross_entropy"}
    return {"forward_backward_input": payload, "model_id": model_id, "seq_id": seq_id}


def _create(tenant, model_seq: int, seed: int) -> str:
    body = {
        "session_id": tenant.session,
        "model_seq_id": model_seq,
        "base_model": "bundled://tiny-qwen3",
        "lora_config": {"rank": 4, "seed": seed},
    }
    submitted = tenant.post("/create_model", body)
    assert submitted.status_code == 200, submitted.text
    result = tenant.post("/retrieve_future", {"request_id": submitted.json()["request_id"]})
    assert result.json().get("model_id") == submitted.json()["model_id"], result.text
    return submitted.json()["model_id"]


def _lora_a(state, model_id: str) -> dict[str, torch.Tensor]:
    adapter = state.model.live[model_id].adapter
    named = state.model.model.model.named_parameters()
    return {k.replace(adapter, "*"): p.detach().clone() for k, p in named if adapter in k}


def test_model_facts_are_asked_once_at_start(server):
    state, _, _ = server
    hf_model = state.model.model.model
    assert state.model.vocab_size == hf_model.get_output_embeddings().weight.shape[0] > 0
    assert state.model.pad_token_id == (hf_model.config.pad_token_id or 0)
    assert (Path(state.model.model_folder) / "config.json").is_file()
    assert state.model.workers == 1


def test_lora_seed_draws_the_same_weights_and_spares_the_rng(server, make_tenant, monkeypatch):
    state, http, keys = server
    monkeypatch.setattr(state.config.limits, "max_loras_per_key", 3)  # one key, three models
    tenant = make_tenant(http, keys["bob"])
    rng = torch.get_rng_state()
    first, second, other = (_create(tenant, i, seed) for i, seed in enumerate((3, 3, 4)))
    assert torch.equal(torch.get_rng_state(), rng)
    a, b, c = (_lora_a(state, m) for m in (first, second, other))
    keys_a = [k for k in a if "lora_A" in k]
    assert keys_a and all(torch.equal(a[k], b[k]) for k in keys_a)
    assert not torch.equal(a[keys_a[0]], c[keys_a[0]])
    for model_id in (first, second, other):  # free the slots for the next test
        state.model.worker.submit(model_id, lambda m=model_id: state.model.release(m)).result()


def _result(tenant, model_id: str, seq_id: int, datums: int) -> dict:
    accepted = tenant.post("/forward_backward", _fwd_body(model_id, seq_id, datums))
    assert accepted.status_code == 200, accepted.text
    result = tenant.post("/retrieve_future", {"request_id": accepted.json()["request_id"]})
    assert "loss_fn_outputs" in result.json(), result.text
    return result.json()


def _logprobs(result: dict) -> list[np.ndarray]:
    return [np.asarray(o["logprobs"]["data"]) for o in result["loss_fn_outputs"]]


def test_data_parallel_workers_outputs_join_in_datum_order(server, make_tenant, monkeypatch):
    """Two workers played in process: the model's own dispatch (``slice_dp_rows``) cuts the
    batch tensors by rows, the model runs each share, and its ``collect='rows'`` joins the
    two outputs, as a Ray group does. The joined logprobs and loss:sum are those of one
    worker's run (float32 sums of the same rows in smaller matmuls). The idle share of a
    one-datum batch needs DDP's collective, so it runs on real workers only
    (tests/tinker/test_ray_data_parallel.py)."""
    state, http, keys = server
    tenant = make_tenant(http, keys["alice"])
    model_id = _create(tenant, 0, seed=1)
    model = state.model.model.models[0]  # the one copy of the model
    one_worker = model.forward_backward
    spec = find_remote_spec(type(model), "forward_backward")
    mesh = DeviceMesh.from_sizes(dp_size=2, device_type="cpu")
    shares = []

    def two_workers(*args, **kwargs):
        outputs = []
        for rank in range(2):
            share_args, share_kwargs = dispatch(spec.dispatch, 2, rank, args, kwargs, mesh)
            shares.append(share_args[0]["input_ids"].shape[0])
            assert share_kwargs["weights"].shape[0] == shares[-1]  # loss inputs cut alike
            outputs.append(one_worker(*share_args, **share_kwargs))
        return collect(spec.collect, outputs, mesh)

    seq_id = 0
    for datums, split in ((3, [2, 1]), (2, [1, 1])):
        expected = _result(tenant, model_id, seq_id := seq_id + 1, datums)
        monkeypatch.setattr(model, "forward_backward", two_workers)
        got = _result(tenant, model_id, seq_id := seq_id + 1, datums)
        monkeypatch.undo()
        assert shares[-2:] == split
        assert [len(g) for g in _logprobs(got)] == [len(TOKENS) - 1 - i for i in range(datums)]
        for g, e in zip(_logprobs(got), _logprobs(expected), strict=True):
            # two shares against one batch: float32 sums in another order
            np.testing.assert_allclose(
                g, e, **reduction_tolerance(np.asarray(e, dtype=np.float32), terms=VOCAB)
            )
        loss = got["metrics"]["loss:sum"]
        weighted = -sum((1.0 + i) * g.sum() for i, g in enumerate(_logprobs(got)))
        assert loss == pytest.approx(weighted, rel=1e-5)
        assert loss == pytest.approx(expected["metrics"]["loss:sum"], rel=1e-6)
    state.model.worker.submit(model_id, lambda: state.model.release(model_id)).result()
