"""What the Tinker routes ask of the model, all through its remote functions so that
``mode: ray``/``http`` serve them as ``embedded`` does (the SDK against a Ray server runs in
twinkle-kit's tests/tinker/test_ray_mode.py): the vocabulary size, pad id and model folder
asked once, seeded LoRA weights, and a clear refusal where a model group of several
data-parallel workers would return some datums' logprobs only.
"""

from __future__ import annotations

from pathlib import Path

import torch

TOKENS = [5, 9, 17, 33, 2, 40]


def _fwd_body(model_id: str, seq_id: int) -> dict:
    def tensor(values, dtype):
        return {"data": list(values), "dtype": dtype}

    datum = {
        "model_input": {"chunks": [{"tokens": TOKENS[:-1]}]},
        "loss_fn_inputs": {
            "target_tokens": tensor(TOKENS[1:], "int64"),
            "weights": tensor([1.0] * (len(TOKENS) - 1), "float32"),
        },
    }
    payload = {"data": [datum], "loss_fn": "cross_entropy"}
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


def test_lora_seed_draws_the_same_weights_and_spares_the_rng(server, make_tenant):
    state, http, keys = server
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


def test_several_data_parallel_workers_are_refused_with_the_fix(server, make_tenant, monkeypatch):
    state, http, keys = server
    tenant = make_tenant(http, keys["alice"])
    model_id = _create(tenant, 0, seed=1)
    monkeypatch.setattr(state.model, "workers", 2)
    refused = tenant.post("/forward_backward", _fwd_body(model_id, 1))
    assert refused.status_code == 503
    assert "ranks: 1" in refused.text and "2 data-parallel workers" in refused.text
    monkeypatch.setattr(state.model, "workers", 1)
    # The refused request freed seq_id 1: the next one runs at once.
    accepted = tenant.post("/forward_backward", _fwd_body(model_id, 2))
    assert accepted.status_code == 200, accepted.text
    result = tenant.post("/retrieve_future", {"request_id": accepted.json()["request_id"]})
    assert result.json()["metrics"]["loss:sum"] > 0, result.text
