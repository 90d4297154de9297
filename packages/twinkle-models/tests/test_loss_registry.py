"""The loss registry, build_loss, the Loss base class and MSELoss."""

import pytest
import torch

import twinkle.loss as losses
from twinkle.loss import LOSSES, CrossEntropyLoss, GRPOLoss, Loss, MSELoss, build_loss

EXPECTED = {
    "BNPOLoss",
    "CISPOLoss",
    "CPOLoss",
    "ChunkedCrossEntropyLoss",
    "CrossEntropyLoss",
    "DPOLoss",
    "DecoupledPPOLoss",
    "DRGRPOLoss",
    "GKDLoss",
    "GRPOLoss",
    "GSPOLoss",
    "InfonceLoss",
    "MSELoss",
    "ORPOLoss",
    "PPOLoss",
    "PPOValueLoss",
    "SAPOLoss",
    "SimPOLoss",
}


def test_every_loss_is_registered_under_its_class_name_and_exported():
    assert set(LOSSES.names()) == EXPECTED
    for name in EXPECTED:
        assert LOSSES.get(name) is getattr(losses, name)
        assert issubclass(LOSSES.get(name), Loss)


def test_build_loss_from_name_class_or_instance():
    built = build_loss("GRPOLoss", epsilon=0.1, beta=0.02)
    assert isinstance(built, GRPOLoss)
    assert (built.epsilon, built.epsilon_high, built.beta) == (0.1, 0.1, 0.02)
    assert isinstance(build_loss(CrossEntropyLoss, ignore_index=-1), CrossEntropyLoss)
    instance = MSELoss()
    assert build_loss(instance) is instance

    def plain_function(inputs, outputs, **kwargs):
        return {"loss": torch.tensor(0.0), "num_tokens": torch.tensor(1)}

    assert build_loss(plain_function) is plain_function


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(
        ValueError, match="unknown loss 'GRPO'; known: BNPOLoss, CISPOLoss, .*MSELoss"
    ):
        build_loss("GRPO")


@pytest.mark.parametrize(
    ("loss", "kwargs", "error", "message"),
    [
        (MSELoss(), {"beta": 1}, TypeError, "already built"),
        (torch.nn.MSELoss, {}, TypeError, "must subclass Loss"),
        (3, {}, TypeError, "known names"),
    ],
)
def test_bad_build_requests(loss, kwargs, error, message):
    with pytest.raises(error, match=message):
        build_loss(loss, **kwargs)


def test_loss_base_cannot_be_used_without_call():
    with pytest.raises(TypeError):
        Loss()


def test_mse_is_a_sum_over_values_counted_by_values():
    predictions = torch.tensor([[0.5, 2.0], [1.0, -1.0]], dtype=torch.float64, requires_grad=True)
    targets = [[1.0, 2.0], [0.0, 1.0]]
    out = MSELoss()({"targets": targets}, {"predictions": predictions})
    assert out["loss"].item() == pytest.approx(0.25 + 0 + 1 + 4)
    assert out["num_tokens"].item() == 4
    out["loss"].backward()
    assert predictions.grad.tolist() == [[-1.0, 0.0], [2.0, -4.0]]
    via_kwargs = MSELoss()({}, {"predictions": predictions}, targets=targets)
    assert via_kwargs["loss"].item() == out["loss"].item()


@pytest.mark.parametrize(
    ("inputs", "outputs", "message"),
    [
        (
            {"targets": [1.0, 2.0]},
            {"predictions": torch.zeros(2, 1)},
            r"\(2, 1\) but targets \(2,\)",
        ),
        ({}, {"predictions": torch.zeros(2)}, "needs targets"),
        ({"targets": [1.0]}, {}, r"needs outputs\['predictions'\]"),
    ],
)
def test_mse_bad_inputs(inputs, outputs, message):
    with pytest.raises(ValueError, match=message):
        MSELoss()(inputs, outputs)
