"""A pool's tenants share no state: removing one leaves peft consistent for the next, each
draws its dropout from its own generators (saved with its checkpoint), and a LoRA adapter's
initial weights depend on the model's seed and the adapter's name alone."""

import pytest
import torch
from peft import LoraConfig

from twinkle.model import TransformersModel
from twinkle.model.transformers.multi_lora import MultiLoraTransformersModel

BASE = "bundled://tiny-qwen3"
BATCH = [
    {"input_ids": [1, 2, 3, 4, 5, 6, 7, 8], "labels": [-100, -100, 3, 4, 5, 6, 7, 8]},
    {"input_ids": [8, 7, 6, 5, 4, 3], "labels": [-100, 7, 6, 5, 4, 3]},
]


@pytest.fixture(scope="module")
def pool():
    return MultiLoraTransformersModel(BASE, max_loras=3, max_rank=8, device="cpu")


def _lora(dropout: float = 0.0) -> LoraConfig:
    return LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules="all-linear")


def _weights(model, name: str) -> dict[str, torch.Tensor]:
    return {
        k.replace(f".{name}.", "."): v.detach().clone()
        for k, v in model.model.named_parameters()
        if f".{name}." in k
    }


def _train_step(model, name: str) -> float:
    loss = model.forward_backward(BATCH, adapter_name=name).loss
    model.clip_grad_and_step(adapter_name=name)
    return loss


def _empty(pool) -> None:
    for name in pool.adapter_names:
        pool.remove_adapter(name)


def test_after_the_pool_empties_the_next_adapters_first_save_works(pool, tmp_path):
    pool.add_adapter_to_model("gone", _lora())
    _train_step(pool, "gone")
    pool.remove_adapter("gone")
    assert pool.adapter_names == [] and pool.model.active_adapters == []
    pool.add_adapter_to_model("next", _lora())
    before = _weights(pool, "next")
    path = pool.save("c0", tmp_path, adapter_name="next")  # was a KeyError in peft
    assert pool.model.active_adapter == "next"
    fresh = MultiLoraTransformersModel(BASE, max_loras=1, max_rank=8, device="cpu")
    fresh.load(path, adapter_name=None)
    loaded = _weights(fresh, "next")
    assert loaded.keys() == before.keys()
    assert all(torch.equal(loaded[k], before[k]) for k in before)
    loss = _train_step(pool, "next")  # the pool still trains
    assert torch.isfinite(torch.tensor(loss))
    assert all(torch.isfinite(v).all() for v in _weights(pool, "next").values())
    _empty(pool)


def test_every_operation_runs_on_the_adapter_it_names(pool, tmp_path):
    pool.add_adapter_to_model("a", _lora())
    pool.add_adapter_to_model("b", _lora())
    pool.set_optimizer("AdamW", lr=1e-2, adapter_name="a")
    _train_step(pool, "a")
    assert pool.model.active_adapter == "a"
    pool.save("b0", tmp_path, adapter_name="b")
    assert pool.model.active_adapter == "b"
    pool.get_train_configs(adapter_name="a")
    assert pool.model.active_adapter == "a"
    pool.remove_adapter("a")  # the active one: peft now names the one left
    assert pool.model.active_adapter == "b"
    pool.remove_adapter("b")
    assert pool.model.active_adapters == []


def _losses(pool, name: str, steps: int, neighbour: str | None = None) -> list[float]:
    """``name``'s training losses, with ``neighbour`` training a step between each of them."""
    losses = []
    for _ in range(steps):
        losses.append(_train_step(pool, name))
        if neighbour is not None:
            _train_step(pool, neighbour)
    return losses


def test_a_tenants_dropout_is_its_own_and_resumes_with_it(pool, tmp_path):
    # Two adapters from one seed start alike: same weights and same dropout stream.
    pool.add_seeded_adapter("alone", _lora(0.1), seed=7)
    pool.add_seeded_adapter("crowded", _lora(0.1), seed=7)
    pool.add_seeded_adapter("neighbour", _lora(0.1), seed=8)
    for name in pool.adapter_names:
        pool.set_optimizer("AdamW", lr=1e-2, adapter_name=name)
    alone = _losses(pool, "alone", 1)
    path = pool.save("after-one", tmp_path, adapter_name="alone")
    alone += _losses(pool, "alone", 3)
    process_rng = torch.get_rng_state()
    crowded = _losses(pool, "crowded", 4, neighbour="neighbour")
    assert crowded == alone  # bit for bit: the neighbour's masks come from its own stream
    # Dropout is on: without it the same adapter's second loss is another number (the first
    # is not: LoRA's B matrix starts at zero, so the masked path adds nothing yet).
    pool.remove_adapter("crowded")
    pool.add_seeded_adapter("no-dropout", _lora(0.0), seed=7)
    pool.set_optimizer("AdamW", lr=1e-2, adapter_name="no-dropout")
    assert _losses(pool, "no-dropout", 2)[1] != alone[1]
    pool.remove_adapter("no-dropout")
    # A resume continues the tenant's stream, and leaves the process's (and others') alone.
    pool.add_seeded_adapter("resumed", _lora(0.1), seed=99)
    pool.set_optimizer("AdamW", lr=1e-2, adapter_name="resumed")
    assert pool.resume_from_checkpoint(path, adapter_name="resumed")["step"] == 1
    assert torch.equal(torch.get_rng_state(), process_rng)
    assert _losses(pool, "resumed", 3, neighbour="neighbour") == alone[1:]
    _empty(pool)


def _fresh_lora(name: str, seed: int = 0) -> dict[str, torch.Tensor]:
    model = TransformersModel(BASE, device="cpu", seed=seed)
    model.add_adapter_to_model(name, _lora())
    return _weights(model, name)


def test_lora_weights_start_from_the_model_seed_and_the_adapter_name():
    first = _fresh_lora("default")
    torch.rand(1000)  # the process's generator moved on: the adapter does not follow it
    second = _fresh_lora("default")
    assert first.keys() == second.keys() and len(first) > 0
    assert all(torch.equal(first[k], second[k]) for k in first)
    lora_a = [k for k in first if "lora_A" in k]
    other_name, other_seed = _fresh_lora("other"), _fresh_lora("default", seed=1)
    assert all(not torch.equal(first[k], other_name[k]) for k in lora_a)
    assert all(not torch.equal(first[k], other_seed[k]) for k in lora_a)
