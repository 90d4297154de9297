"""Every bundled family trains and round-trips through plain transformers and peft: a
conversation encoded by the generic Template (the family's own chat template), one LoRA
step with TransformersModel, then the saved adapter (in peft) and the merged export (in
transformers) give the trained model's logits (float32, 1e-5); full training likewise on
the unusual layouts."""

import pytest
import torch
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM

from twinkle.hub.bundled import bundled_names
from twinkle.model import TransformersModel
from twinkle.template import Template

FAMILIES = bundled_names("model")
ROW = {
    "messages": [
        {"role": "system", "content": "You help."},
        {"role": "user", "content": "What is 2 plus 3?"},
        {"role": "assistant", "content": "It is 5."},
    ]
}


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


def trained(model_id: str, lora: bool) -> tuple[TransformersModel, torch.Tensor]:
    feature = Template(model_id).encode(ROW)
    assert (feature["labels"] != -100).any()
    model = TransformersModel(model_id, device="cpu")
    if lora:
        model.add_adapter_to_model("default", LoraConfig(r=2, target_modules="all-linear"))
    model.set_optimizer("AdamW", lr=1e-2)
    model.forward_backward([feature])
    model.clip_grad_and_step(1.0)
    return model, torch.as_tensor(feature["input_ids"])[None]


@pytest.mark.parametrize("name", FAMILIES)
def test_lora_trains_saves_and_reloads_in_peft_and_merged(name, tmp_path):
    model_id = f"bundled://{name}"
    model, ids = trained(model_id, lora=True)
    expected = logits(model.model, ids)
    adapter = model.save("lora", output_dir=tmp_path, save_optimizer=False)
    base = TransformersModel(model_id, device="cpu").model  # the same seeded base
    reloaded = PeftModel.from_pretrained(base, adapter)
    torch.testing.assert_close(logits(reloaded, ids), expected, atol=1e-5, rtol=0)
    merged = AutoModelForCausalLM.from_pretrained(model.merge_and_export(tmp_path / "merged"))
    torch.testing.assert_close(logits(merged, ids), expected, atol=1e-5, rtol=0)


# Full training on the layouts LoRA's test does not already load back whole (a dense model
# is covered by tests/test_checkpoint.py): MoE, MLA, linear attention, Gemma's scaling.
@pytest.mark.parametrize("name", ["tiny-deepseek-v3", "tiny-gemma3", "tiny-qwen3.5-moe"])
def test_full_training_saves_a_folder_transformers_loads(name, tmp_path):
    model, ids = trained(f"bundled://{name}", lora=False)
    expected = logits(model.model, ids)
    folder = model.save("full", output_dir=tmp_path, save_optimizer=False)
    reloaded = AutoModelForCausalLM.from_pretrained(folder)
    torch.testing.assert_close(logits(reloaded, ids), expected, atol=1e-5, rtol=0)
