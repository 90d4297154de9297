"""TransformersModel checkpoints: layout, atomic replacement, refusal of broken folders,
weights-only loading and resume, and the merged export (exact resume: test_checkpoint_resume)."""

import json
import os
import random
import shutil

import numpy as np
import pytest
import torch
from peft import LoraConfig, PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

import twinkle.model.checkpoint as checkpoint_module
from twinkle.model import TransformersModel
from twinkle.model.checkpoint import CheckpointError, read_record
from twinkle.model.rng_state import capture_rng_state, restore_rng_state
from twinkle.template import build_template

BASE = "bundled://tiny-qwen3"


@pytest.fixture(scope="module")
def batch():
    template = build_template("Qwen3_5Template", model_id=BASE)
    rows = [
        ("who are you?", "I am twinkle, trained by the community."),
        ("what can you do?", "I answer questions about myself."),
    ]
    trajectories = [
        {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
        for q, a in rows
    ]
    return template.batch_encode(trajectories)


def lora(r: int = 4, target_modules: str | list[str] = "all-linear") -> LoraConfig:
    return LoraConfig(r=r, lora_alpha=8, lora_dropout=0.1, target_modules=target_modules)


def make(adapter: str | None = "default", model_id: str = BASE, optimizer: bool = True, **kw):
    model = TransformersModel(model_id, device="cpu")
    if adapter is not None:
        model.add_adapter_to_model(adapter, lora(**kw))
    if optimizer:
        model.set_optimizer("AdamW", lr=1e-2)
        model.set_lr_scheduler("CosineWarmupScheduler", num_warmup_steps=1, num_training_steps=10)
    return model


def train(model: TransformersModel, batch, steps: int, adapter_name: str | None = None) -> None:
    for _ in range(steps):
        model.forward_backward(inputs=batch, adapter_name=adapter_name)
        model.clip_grad_and_step(adapter_name=adapter_name)


def trainable(model: TransformersModel) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.model.named_parameters() if p.requires_grad}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@torch.no_grad()
def logits(module: torch.nn.Module, batch) -> torch.Tensor:
    module.eval()
    ids = torch.as_tensor(np.asarray(batch[0]["input_ids"]))[None]
    return module(input_ids=ids).logits


# ---- what a checkpoint holds ----------------------------------------------------------------


def test_adapter_checkpoint_holds_everything_to_resume(tmp_path, batch):
    model = make()
    train(model, batch, 2)
    before = capture_rng_state()
    path = model.save("ckpt", output_dir=tmp_path, consumed_train_samples=8)
    after = capture_rng_state()
    assert torch.equal(before["torch"], after["torch"]) and before["python"] == after["python"]
    assert path == str((tmp_path / "ckpt").absolute())
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]  # no temporary folder left behind
    assert sorted(os.listdir(path)) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "optimizer.pt",
        "rng_state.pt",
        "scheduler.pt",
        "trainer_state.json",
    ]
    state = json.loads((tmp_path / "ckpt" / "trainer_state.json").read_text())
    assert state["kind"] == "adapter" and state["adapter_name"] == "default"
    assert (state["step"], state["accumulated_calls"], state["consumed_train_samples"]) == (2, 0, 8)
    assert state["adapter_config"]["r"] == 4 and state["adapter_config"]["lora_dropout"] == 0.1
    assert (state["optimizer"], state["lr_scheduler"]) == ("AdamW", "CosineWarmupScheduler")
    assert {"twinkle-models", "torch", "transformers", "peft"} <= state["versions"].keys()
    assert state["complete"] is True
    # Only the adapter's tensors are saved, never the base model's.
    assert all("lora_" in key for key in load_file(f"{path}/adapter_model.safetensors"))


def test_save_without_optimizer_state(tmp_path, batch):
    model = make()
    train(model, batch, 1)
    path = model.save("weights", output_dir=tmp_path, save_optimizer=False)
    assert not {"optimizer.pt", "scheduler.pt"} & set(os.listdir(path))
    _, record = read_record(path)
    assert record.optimizer is None and record.lr_scheduler is None


def test_adapter_checkpoint_loads_with_plain_peft(tmp_path, batch):
    model = make("sft")  # not 'default': peft would save it in a subfolder of that name
    train(model, batch, 2)
    path = model.save("sft-ckpt", output_dir=tmp_path)
    base = TransformersModel(BASE, device="cpu").model
    plain = PeftModel.from_pretrained(base, path)
    assert torch.equal(logits(plain, batch), logits(model.model, batch))


def test_lora_on_lm_head_saves_the_lora_tensors_not_the_output_matrix(tmp_path, batch):
    """peft alone would save the whole base lm_head with the adapter (a vocabulary-sized
    matrix per checkpoint); LoRA does not change it, so only LoRA tensors go out, and the
    adapter still loads with plain peft and back into a model."""
    model = make(target_modules=["q_proj", "lm_head"])
    train(model, batch, 2)
    path = model.save("head", output_dir=tmp_path)
    keys = load_file(f"{path}/adapter_model.safetensors").keys()
    assert any("lm_head.lora_" in key for key in keys)
    assert all("lora_" in key for key in keys), sorted(keys)
    plain = PeftModel.from_pretrained(TransformersModel(BASE, device="cpu").model, path)
    assert torch.equal(logits(plain, batch), logits(model.model, batch))
    again = make(target_modules=["q_proj", "lm_head"])
    again.load(path)
    assert torch.equal(logits(again.model, batch), logits(model.model, batch))


def test_full_checkpoint_is_a_model_folder(tmp_path, batch):
    model = make(adapter=None)
    train(model, batch, 2)
    path = model.save("full", output_dir=tmp_path, consumed_train_samples=4)
    names = set(os.listdir(path))
    assert {"config.json", "model.safetensors", "tokenizer.json", "trainer_state.json"} <= names
    assert read_record(path)[1].kind == "full"
    again = TransformersModel(model_id=path, device="cpu")
    assert same(dict(again.model.state_dict()), dict(model.model.state_dict()))
    assert torch.equal(
        logits(AutoModelForCausalLM.from_pretrained(path), batch), logits(model.model, batch)
    )
    assert AutoTokenizer.from_pretrained(path)("who are you?")["input_ids"]
    build_template("Qwen3_5Template", model_id=path)  # its tokenizer serves the template


# ---- replacing and interrupting --------------------------------------------------------------


def test_saving_twice_replaces_the_checkpoint(tmp_path, batch):
    model = make()
    train(model, batch, 1)
    model.save("last", output_dir=tmp_path)
    train(model, batch, 1)
    path = model.save("last", output_dir=tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["last"]
    assert read_record(path)[1].step == 2
    fresh = make()
    fresh.load(path)
    assert same(trainable(fresh), trainable(model))
    with pytest.raises(FileExistsError, match="overwrite=True"):
        model.save("last", output_dir=tmp_path, overwrite=False)


def test_an_interrupted_save_keeps_the_previous_checkpoint(tmp_path, batch, monkeypatch):
    model = make()
    train(model, batch, 1)
    path = model.save("last", output_dir=tmp_path)
    saved = {name: (tmp_path / "last" / name).read_bytes() for name in os.listdir(path)}
    train(model, batch, 1)

    def crash(folder, record):  # everything but the completeness marker is written
        raise OSError("disk full")

    monkeypatch.setattr("twinkle.model.transformers.checkpointing.write_record", crash)
    with pytest.raises(OSError, match="disk full"):
        model.save("last", output_dir=tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["last"]  # the temporary folder is gone
    assert {n: (tmp_path / "last" / n).read_bytes() for n in os.listdir(path)} == saved
    assert read_record(path)[1].step == 1


def test_a_failed_rename_puts_the_previous_checkpoint_back(tmp_path, batch, monkeypatch):
    model = make()
    train(model, batch, 1)
    path = model.save("last", output_dir=tmp_path)
    real_rename, calls = os.rename, []

    def rename(src, dst):  # the old folder moves aside; moving the new one in fails
        calls.append(src)
        if len(calls) == 2:
            raise OSError("rename failed")
        real_rename(src, dst)

    monkeypatch.setattr(checkpoint_module.os, "rename", rename)
    train(model, batch, 1)
    with pytest.raises(OSError, match="rename failed"):
        model.save("last", output_dir=tmp_path)
    monkeypatch.setattr(checkpoint_module.os, "rename", real_rename)
    assert sorted(os.listdir(tmp_path)) == ["last"]
    assert read_record(path)[1].step == 1


def test_a_folder_that_is_not_a_checkpoint_is_never_replaced(tmp_path, batch):
    model = make()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="refusing to replace it"):
        model.save("notes", output_dir=tmp_path)
    with pytest.raises(FileExistsError, match="refusing to replace it"):
        model.merge_and_export(tmp_path)  # the parent folder, holding everything else
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"
    assert sorted(os.listdir(tmp_path)) == ["notes"]


def test_checkpoint_names_are_folder_names(tmp_path, batch):
    model = make()
    for name in ("../escape", "a/b", "", ".hidden"):
        with pytest.raises(ValueError, match="plain folder name"):
            model.save(name, output_dir=tmp_path)
    with pytest.raises(ValueError, match="consumed_train_samples"):
        model.save("x", output_dir=tmp_path, consumed_train_samples=-1)
    assert os.listdir(tmp_path) == []


# ---- refusing what cannot be resumed ---------------------------------------------------------


@pytest.fixture
def saved(tmp_path, batch):
    """A LoRA run saved after 2 steps, and the random state it saved."""
    model = make()
    train(model, batch, 2)
    path = model.save("ckpt", output_dir=tmp_path / "out", consumed_train_samples=8)
    return model, path, capture_rng_state()


def test_resuming_from_a_missing_path_names_it_and_the_checkpoints_there(saved):
    model, path, _ = saved
    missing = os.path.join(os.path.dirname(path), "nope")
    with pytest.raises(FileNotFoundError, match=r"nope.*checkpoints in .*: ckpt"):
        model.resume_from_checkpoint(missing)


def truncate(path: str) -> None:
    with open(path, "r+") as handle:
        handle.truncate(20)


def set_field(path: str, key: str, value) -> None:
    with open(path) as handle:
        state = json.load(handle)
    state[key] = value
    with open(path, "w") as handle:
        json.dump(state, handle)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p: os.remove(f"{p}/trainer_state.json"), "trainer_state.json, which save"),
        (lambda p: os.remove(f"{p}/optimizer.pt"), "optimizer.pt missing"),
        (lambda p: os.remove(f"{p}/adapter_model.safetensors"), "adapter_model.safetensors"),
        (lambda p: truncate(f"{p}/trainer_state.json"), "cannot be read"),
        (lambda p: set_field(f"{p}/trainer_state.json", "format_version", 99), "upgrade"),
        (lambda p: set_field(f"{p}/trainer_state.json", "complete", False), "not mark .* complete"),
    ],
    ids=["no-marker", "no-optimizer", "no-weights", "cut-marker", "future-format", "incomplete"],
)
def test_a_half_written_checkpoint_is_refused(saved, tmp_path, damage, message):
    model, path, _ = saved
    broken = tmp_path / "broken"
    shutil.copytree(path, broken)
    damage(str(broken))
    before = trainable(model)
    with pytest.raises(CheckpointError, match=message) as error:
        model.resume_from_checkpoint(str(broken))
    assert str(broken) in str(error.value)
    assert same(trainable(model), before)  # refused before anything changed
    assert model.resume_from_checkpoint(path)["step"] == 2  # the complete one still resumes


def test_resuming_before_set_optimizer_says_what_to_call(saved):
    _, path, _ = saved
    no_optimizer = make(optimizer=False)
    before = trainable(no_optimizer)
    with pytest.raises(CheckpointError, match=r"set_optimizer\(.*before resume_from_checkpoint"):
        no_optimizer.resume_from_checkpoint(path)
    assert same(trainable(no_optimizer), before)
    no_scheduler = make(optimizer=False)
    no_scheduler.set_optimizer("AdamW", lr=1e-2)
    with pytest.raises(CheckpointError, match=r"set_lr_scheduler"):
        no_scheduler.resume_from_checkpoint(path)
    no_adapter = make(adapter=None, optimizer=False)
    with pytest.raises(CheckpointError, match=r"add_adapter_to_model\('default'"):
        no_adapter.resume_from_checkpoint(path)
    other_optimizer = make(optimizer=False)
    other_optimizer.set_optimizer("SGD", lr=1e-2)
    with pytest.raises(CheckpointError, match="AdamW optimizer state.*SGD"):
        other_optimizer.resume_from_checkpoint(path)


def test_a_different_lora_config_is_refused(saved):
    _, path, _ = saved
    with pytest.raises(CheckpointError, match="r: saved 4, here 8"):
        make(r=8).load(path)
    with pytest.raises(CheckpointError, match="parameter groups .* train the same parameters"):
        make(target_modules=["q_proj"]).resume_from_checkpoint(path)


def test_a_full_checkpoint_does_not_load_into_adapters(tmp_path, batch):
    path = make(adapter=None).save("full", output_dir=tmp_path)
    with pytest.raises(CheckpointError, match="holds a full model"):
        make().load(path)


# ---- what a resume restores ------------------------------------------------------------------


def test_resume_restores_weights_optimizer_scheduler_counters_and_rng(saved, batch):
    model, path, rng = saved
    resumed = make()
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    progress = resumed.resume_from_checkpoint(path)
    assert progress == {"consumed_train_samples": 8, "step": 2}
    assert same(trainable(resumed), trainable(model))
    state, original = resumed._states["default"], model._states["default"]
    assert (state.step, state.accumulated_calls) == (2, 0)
    assert state.lr_scheduler.state_dict() == original.lr_scheduler.state_dict()
    got, want = state.optimizer.state_dict(), original.optimizer.state_dict()
    assert got["param_groups"] == want["param_groups"]
    assert all(
        torch.equal(got["state"][i][k], want["state"][i][k])
        for i in want["state"]
        for k in want["state"][i]
    )
    # The generators stand where save found them, not where the seeding above left them.
    now = capture_rng_state()
    assert torch.equal(now["torch"], rng["torch"]) and now["python"] == rng["python"]
    assert torch.equal(now["numpy"]["keys"], rng["numpy"]["keys"])


def test_resume_only_model_restores_weights_but_not_the_optimizer(saved):
    model, path, _ = saved
    resumed = make()
    progress = resumed.resume_from_checkpoint(path, resume_only_model=True)
    assert progress == {"consumed_train_samples": 8, "step": 2}  # still given, to skip data
    assert same(trainable(resumed), trainable(model))
    state = resumed._states["default"]
    assert state.optimizer.state_dict()["state"] == {}
    assert state.step == 0 and state.lr_scheduler.last_epoch == 0
    bare = TransformersModel(BASE, device="cpu")  # no adapter yet: it comes from the checkpoint
    bare.resume_from_checkpoint(path, resume_only_model=True)
    assert bare.adapter_names == ["default"]
    assert same(trainable(bare), trainable(model))


def test_load_with_load_optimizer_restores_the_training_state(saved):
    """The documents' client examples resume with model.load(path, load_optimizer=True)."""
    model, path, _ = saved
    resumed = make()
    resumed.load(path, load_optimizer=True)
    state, original = resumed._states["default"], model._states["default"]
    assert state.step == 2
    assert state.lr_scheduler.state_dict() == original.lr_scheduler.state_dict()
    assert state.optimizer.state_dict()["state"][0]["exp_avg"].abs().sum() > 0


def test_load_takes_weights_only_and_can_rename_the_adapter(saved):
    model, path, _ = saved
    other = make("other", optimizer=False)
    other.load(path, adapter_name="other")
    ours = {k.replace(".other.", ".default."): v for k, v in trainable(other).items()}
    assert same(ours, trainable(model))
    assert other._states["other"].step == 0
    two = make("first", optimizer=False)
    two.add_adapter_to_model("second", lora())
    with pytest.raises(CheckpointError, match="pass adapter_name="):
        two.load(path)


def test_rng_state_round_trips_through_a_weights_only_file(tmp_path):
    state = capture_rng_state()
    torch.save(state, tmp_path / "rng.pt")
    draws = (random.random(), np.random.rand(), torch.rand(3))
    restore_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert draws[:2] == again[:2] and torch.equal(draws[2], again[2])


# ---- merged export ---------------------------------------------------------------------------


def test_merge_and_export_writes_a_plain_model_with_the_adapters_outputs(tmp_path, batch):
    model = make("first")
    model.add_adapter_to_model("second", lora(r=2))
    train(model, batch, 2, adapter_name="first")
    model.set_optimizer("AdamW", lr=1e-2, adapter_name="second")
    train(model, batch, 1, adapter_name="second")
    everything = {k: v.clone() for k, v in model.model.state_dict().items()}
    path = model.merge_and_export(tmp_path / "merged", adapter_name="first")
    assert same(dict(model.model.state_dict()), everything)  # the trained model is untouched
    assert not any("lora" in key for key in load_file(f"{path}/model.safetensors"))
    merged = AutoModelForCausalLM.from_pretrained(path)
    model.model.set_adapter("first")
    expected = logits(model.model, batch)
    torch.testing.assert_close(logits(merged, batch), expected, atol=1e-5, rtol=0)
    base = logits(TransformersModel(BASE, device="cpu").model, batch)
    assert (base - expected).abs().max() > 1e-3  # the adapter did change the outputs
    assert TransformersModel(model_id=path, device="cpu").adapter_names == []


def test_merge_and_export_of_a_full_model_writes_it_as_is(tmp_path, batch):
    model = make(adapter=None)
    train(model, batch, 1)
    path = model.merge_and_export(tmp_path / "export")
    assert torch.equal(
        logits(AutoModelForCausalLM.from_pretrained(path), batch), logits(model.model, batch)
    )
