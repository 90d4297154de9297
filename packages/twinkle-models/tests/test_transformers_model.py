"""TransformersModel on one CPU: training lowers the loss, accumulation is exact, adapters are
isolated, and bad inputs fail with errors that say what to do."""

import pytest
import torch
from peft import LoraConfig
from transformers import AutoConfig

from twinkle.hub import resolve_model
from twinkle.model import TransformersModel
from twinkle.template import build_template

MODEL_ID = "bundled://tiny-qwen3"
ANSWERS = [
    "I am Twinkle, a model trained by the Twinkle team.",
    "My name is Twinkle.",
    "Twinkle was made by the Twinkle team to help you.",
    "I can answer questions about training models.",
]


def lora(r: int = 8) -> LoraConfig:
    return LoraConfig(r=r, lora_alpha=32, target_modules="all-linear")


@pytest.fixture(scope="module")
def features():
    """Eight encoded conversations of uneven lengths."""
    template = build_template("Qwen3_5Template", model_id=MODEL_ID, max_length=256)
    trajectories = [
        {
            "messages": [
                {"role": "user", "content": f"Question {i}: who are you?" + " Please." * (i % 3)},
                {"role": "assistant", "content": ANSWERS[i % len(ANSWERS)]},
            ]
        }
        for i in range(8)
    ]
    return template.batch_encode(trajectories)


def trainable_snapshot(model: TransformersModel, marker: str) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.model.named_parameters() if marker in n}


def train(model: TransformersModel, features, steps: int, **kwargs) -> list[float]:
    losses = []
    for _ in range(steps):
        losses.append(model.forward_backward(features, **kwargs).loss)
        model.clip_grad_and_step(**kwargs)
    return losses


def test_full_training_lowers_the_loss(features):
    model = TransformersModel(MODEL_ID)
    model.set_optimizer("AdamW", lr=1e-2)
    losses = train(model, features, 12)
    assert losses[-1] < losses[0] - 1.0
    metrics = model.calculate_metric()
    assert {"loss", "token_accuracy", "grad_norm", "lr"} <= set(metrics)
    assert all(isinstance(v, float) for v in metrics.values())
    assert model.calculate_metric() == {}, "calculate_metric resets what it reported"


def test_lora_training_lowers_the_loss_and_trains_only_the_adapter(features):
    model = TransformersModel(MODEL_ID)
    model.add_adapter_to_model("default", lora())
    model.set_optimizer(optimizer_cls="AdamW", lr=1e-2)
    model.set_lr_scheduler("CosineWarmupScheduler", num_warmup_steps=2, num_training_steps=12)
    base_before = {
        n: p.detach().clone() for n, p in model.model.named_parameters() if "lora_" not in n
    }
    losses = train(model, features, 12)
    assert losses[-1] < losses[0] - 0.5
    for name, param in model.model.named_parameters():
        if "lora_" not in name:
            assert torch.equal(param, base_before[name]), f"{name} is frozen but changed"
    assert "trainable" in model.get_train_configs()


def lora_model(gradient_accumulation_steps: int = 1) -> TransformersModel:
    model = TransformersModel(MODEL_ID)
    torch.manual_seed(0)  # the same LoRA init in every model built here
    model.add_adapter_to_model("default", lora(), gradient_accumulation_steps)
    model.set_optimizer("SGD", lr=0.5)
    return model


def assert_same_parameters(a: TransformersModel, b: TransformersModel) -> None:
    pairs = zip(a.model.named_parameters(), b.model.named_parameters(), strict=True)
    for (name, x), (_, y) in pairs:
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=f"{name} differs")


@pytest.fixture(scope="module")
def one_batch_of_eight(features):
    model = lora_model()
    model.forward_backward(features)
    model.clip_grad_and_step(max_grad_norm=1e9)
    return model


def test_micro_batches_of_four_give_the_step_of_one_batch_of_eight(features, one_batch_of_eight):
    """The halves hold different token counts: normalising per half would differ."""
    assert sum(f.length for f in features[:4]) != sum(f.length for f in features[4:])
    halves = lora_model()
    halves.forward_backward(features, micro_batch_size=4)
    halves.clip_grad_and_step(max_grad_norm=1e9)
    assert_same_parameters(one_batch_of_eight, halves)


def test_accumulating_two_calls_gives_the_step_of_one_batch(features, one_batch_of_eight):
    halves = lora_model(gradient_accumulation_steps=2)
    halves.forward_backward(features[:4])
    assert halves.clip_grad_and_step(max_grad_norm=1e9) is None, "first call only accumulates"
    halves.forward_backward(features[4:])
    assert halves.clip_grad_and_step(max_grad_norm=1e9) is not None
    assert_same_parameters(one_batch_of_eight, halves)


def changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> bool:
    return any(not torch.equal(after[k], v) for k, v in before.items())


def test_two_adapters_trained_alternately_leave_each_other_alone(features):
    model = TransformersModel(MODEL_ID)
    model.add_adapter_to_model("alice", lora(8))
    model.add_adapter_to_model("bob", lora(4))
    for name in ("alice", "bob"):
        model.set_optimizer("AdamW", lr=1e-2, adapter_name=name)
    model.forward_backward(features, adapter_name="alice")
    model.clip_grad_and_step(adapter_name="alice")

    bob_before = trainable_snapshot(model, ".bob.")
    model.forward_backward(features, adapter_name="bob")
    model.clip_grad_and_step(adapter_name="bob")
    assert changed(bob_before, trainable_snapshot(model, ".bob."))

    bob_after, alice_before = (
        trainable_snapshot(model, ".bob."),
        trainable_snapshot(model, ".alice."),
    )
    bob_moments = {k: v["exp_avg"].clone() for k, v in model._states["bob"].optimizer.state.items()}
    model.forward_backward(features, adapter_name="alice")
    model.clip_grad_and_step(adapter_name="alice")
    assert changed(alice_before, trainable_snapshot(model, ".alice."))
    assert not changed(bob_after, trainable_snapshot(model, ".bob.")), "training alice moved bob"
    for key, moment in bob_moments.items():
        assert torch.equal(model._states["bob"].optimizer.state[key]["exp_avg"], moment)
    alice_params = set(model._states["alice"].optimizer.state)
    assert alice_params.isdisjoint(model._states["bob"].optimizer.state)


# ---- bad inputs ---------------------------------------------------------------------------


def test_unknown_model_id_names_it():
    with pytest.raises(Exception, match="bundled://no-such-model"):
        TransformersModel("bundled://no-such-model")


def test_lora_on_missing_modules_lists_the_real_ones():
    model = TransformersModel(MODEL_ID)
    with pytest.raises(ValueError, match="q_proj"):
        model.add_adapter_to_model("default", LoraConfig(r=4, target_modules=["not_a_layer"]))


def test_unknown_loss_lists_the_known_ones():
    model = TransformersModel(MODEL_ID)
    with pytest.raises(ValueError, match="CrossEntropyLoss"):
        model.set_loss("NoSuchLoss")


def test_empty_batch_is_a_clear_error():
    """Only a data-parallel worker's share may be empty (it then adds no rows)."""
    model = TransformersModel(MODEL_ID)
    with pytest.raises(ValueError, match="forward_backward got an empty batch"):
        model.forward_backward([])
    empty = {"input_ids": torch.zeros(0, 4, dtype=torch.long)}
    with pytest.raises(ValueError, match="forward_only got an empty batch"):
        model.forward_only(empty)


def test_a_batch_without_label_tokens_is_an_error_not_nan(features):
    model = TransformersModel(MODEL_ID)
    unlabelled = [f.model_copy(update={"labels": [-100] * f.length}) for f in features[:2]]
    with pytest.raises(ValueError, match="no label tokens"):
        model.forward_backward(unlabelled)


def test_token_ids_outside_the_vocabulary_name_the_row_and_the_vocabulary(features):
    """Checked before the forward: past the embedding, torch raises a bare IndexError on a
    CPU and a device-side assert on a GPU."""
    model = TransformersModel(MODEL_ID)
    model.add_adapter_to_model("a", lora())
    vocab = model.model.get_input_embeddings().weight.shape[0]
    for bad in (vocab, -1):
        ids = list(features[1].input_ids)
        ids[3] = bad
        wrong = features[1].model_copy(update={"input_ids": ids})
        message = rf"input_ids row 1 holds token id {bad}, outside .* vocabulary \[0, {vocab}\)"
        for run in (model.forward_backward, model.forward_only):
            with pytest.raises(ValueError, match=message):
                run([features[0], wrong])
    assert all(p.grad is None for p in model.model.parameters())  # nothing ran


def test_trajectories_need_a_template():
    model = TransformersModel(MODEL_ID)
    conversation = {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    }
    with pytest.raises(ValueError, match="set_template"):
        model.forward_backward([conversation])
    model.set_template("Qwen3_5Template")
    assert model.forward_backward([conversation]).loss > 0


def test_components_set_before_the_first_adapter_carry_over_to_it():
    model = TransformersModel(MODEL_ID)
    model.set_loss("GRPOLoss", epsilon=0.3)
    model.add_adapter_to_model("default", lora())
    assert type(model._state(None).loss).__name__ == "GRPOLoss"


def test_embedding_task_without_an_embedding_loss_says_which_to_set(features):
    model = TransformersModel(MODEL_ID)
    pairs = [
        {"input_ids": f.input_ids, "embedding_label": 1 - i % 2} for i, f in enumerate(features[:4])
    ]
    with pytest.raises(ValueError, match=r"set_loss\(InfonceLoss"):
        model.forward_backward(pairs, task="embedding")


def test_forward_calculate_loss_backward_equals_forward_backward(features):
    together = lora_model()
    expected = together.forward_backward(features).loss
    together.clip_grad_and_step(max_grad_norm=1e9)

    apart = lora_model()
    with pytest.raises(ValueError, match=r"call forward\(inputs\), then calculate_loss"):
        apart.backward()
    output = apart.forward(features)
    assert output.logps.shape == (len(features), max(f.length for f in features))
    assert apart.calculate_loss() == pytest.approx(expected, rel=1e-6)
    apart.backward()
    apart.clip_grad_and_step(max_grad_norm=1e9)
    assert_same_parameters(together, apart)


def test_micro_batches_split_per_row_loss_arguments_too(features):
    """GRPO advantages (one per row) must follow the rows into each micro-batch."""
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.25, -0.25])
    whole, halves = lora_model(), lora_model()
    for model in (whole, halves):
        model.set_loss("GRPOLoss")
    whole.forward_backward(features, advantages=advantages)
    halves.forward_backward(features, advantages=advantages, micro_batch_size=3)
    for model in (whole, halves):
        model.clip_grad_and_step(max_grad_norm=1e9)
    assert_same_parameters(whole, halves)


def test_models_that_rescale_logits_keep_the_plain_logits_path(monkeypatch):
    from transformers import GraniteConfig

    from twinkle.model.transformers import model as model_module

    config = GraniteConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, logits_scaling=8.0,
    )  # fmt: skip
    model = TransformersModel(config=config)
    batch = [{"input_ids": [1, 2, 3, 4, 5], "labels": [-100, 2, 3, 4, 5]}]
    plain = model.forward_only(batch).loss
    monkeypatch.setattr(model_module, "prefers_chunked", lambda *args: True)
    assert model.forward_only(batch).loss == pytest.approx(plain, abs=1e-6)


def test_a_given_config_is_the_models_copy_and_is_honoured_with_weights(tmp_path):
    """The model's config is set up after loading (no cache, and under sp / cp another
    attention): the caller's object stays as it was. With a folder of weights, the
    config given is the one the model loads with."""
    config = AutoConfig.from_pretrained(resolve_model(MODEL_ID))
    before = config.to_dict()
    built = TransformersModel(config=config, device="cpu")
    assert built.model.config is not config and built.model.config.use_cache is False
    assert config.to_dict() == before
    built.model.save_pretrained(tmp_path)
    config.rms_norm_eps = 1e-3
    loaded = TransformersModel(str(tmp_path), config=config, device="cpu")
    assert loaded.model.config.rms_norm_eps == 1e-3
    assert torch.equal(loaded.model.lm_head.weight, built.model.lm_head.weight)
