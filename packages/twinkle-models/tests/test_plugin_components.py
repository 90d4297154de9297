"""A plugin's loss and metric by name: ``set_loss`` and ``add_metric`` take
``source:ClassName`` as they take a registered name, through the one resolver."""

from __future__ import annotations

import json

import pytest

from twinkle.hub import PluginError
from twinkle.loss import LOSSES
from twinkle.model import TransformersModel
from twinkle.module.optimizer import OPTIMIZERS
from twinkle.preprocessor import PREPROCESSORS
from twinkle.template import build_template

MODEL_ID = "bundled://tiny-qwen3"
PLUGIN = """
from twinkle.loss import CrossEntropyLoss
from twinkle.metric import Metric


class DoubledLoss(CrossEntropyLoss):
    def __call__(self, inputs, outputs, **kwargs):
        result = super().__call__(inputs, outputs, **kwargs)
        return {**result, "loss": 2 * result["loss"]}


class ForwardCount(Metric):
    def __init__(self):
        self.calls = 0

    def accumulate(self, inputs=None, outputs=None, **kwargs):
        self.calls += inputs is not None

    def calculate(self):
        return {"forward_calls": float(self.calls)} if self.calls else {}

    def reset(self):
        self.calls = 0
"""


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model-plugin")
    (folder / "parts.py").write_text(PLUGIN)
    manifest = {"module": "parts.py", "components": ["DoubledLoss", "ForwardCount"]}
    (folder / "twinkle_plugin.json").write_text(json.dumps(manifest))
    return folder


@pytest.fixture(scope="module")
def features():
    template = build_template("Template", model_id=MODEL_ID, max_length=64)
    rows = [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    ]
    return template.batch_encode(rows)


def test_set_loss_and_add_metric_take_a_plugin_component_by_name(plugin, features):
    model = TransformersModel(MODEL_ID)
    plain = model.forward_only(features).loss
    model.set_loss(f"{plugin}:DoubledLoss")
    model.add_metric(f"{plugin}:ForwardCount", is_training=False)
    assert model.forward_only(features).loss == pytest.approx(2 * plain, rel=1e-5)
    assert model.calculate_metric(is_training=False)["forward_calls"] == 1.0


def test_a_hub_loss_without_consent_is_refused_and_the_model_keeps_its_loss(
    tmp_path, monkeypatch, features
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TWINKLE_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("TWINKLE_TRUST_REMOTE_CODE", raising=False)
    snapshot = tmp_path / "models--org--losses" / "snapshots" / ("c" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "parts.py").write_text(PLUGIN)
    (snapshot / "twinkle_plugin.json").write_text(
        json.dumps({"module": "parts.py", "components": ["DoubledLoss", "ForwardCount"]})
    )
    (tmp_path / "models--org--losses" / "refs").mkdir()
    (tmp_path / "models--org--losses" / "refs" / "main").write_text("c" * 40)
    model = TransformersModel(MODEL_ID)
    plain = model.forward_only(features).loss
    with pytest.raises(PluginError, match="only with consent"):
        model.set_loss("hf://org/losses:DoubledLoss")
    assert model.forward_only(features).loss == pytest.approx(plain)


def test_a_plugin_loss_is_no_preprocessor_and_a_missing_class_lists_the_losses(plugin):
    with pytest.raises(TypeError, match="is not a preprocessor: DoubledLoss subclasses"):
        PREPROCESSORS.get(f"{plugin}:DoubledLoss")
    with pytest.raises(TypeError, match="is not an optimizer: DoubledLoss subclasses"):
        OPTIMIZERS.get(f"{plugin}:DoubledLoss")
    with pytest.raises(ValueError, match="provides DoubledLoss, ForwardCount"):
        LOSSES.get(f"{plugin}:TripledLoss")
