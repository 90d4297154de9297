"""Registry: a component by name or by class; unknown names list the known ones."""

import types

import pytest

from twinkle.utils import Registry


class Loss:
    pass


def make():
    losses = Registry("loss", base=Loss)

    @losses.register
    class CrossEntropyLoss(Loss):
        pass

    @losses.register(name="grpo")
    class GRPOLoss(Loss):
        pass

    return losses, CrossEntropyLoss, GRPOLoss


def test_lookup_by_name_or_by_class():
    losses, ce, grpo = make()
    assert losses.get("CrossEntropyLoss") is ce
    assert losses.get("grpo") is grpo
    assert losses.get(grpo) is grpo
    assert "grpo" in losses and "GRPOLoss" not in losses
    assert losses.names() == ["CrossEntropyLoss", "grpo"]


def test_an_unregistered_subclass_is_accepted_as_a_class():
    losses, _, _ = make()

    class MyLoss(Loss):
        pass

    assert losses.get(MyLoss) is MyLoss
    assert "MyLoss" not in losses


def test_unknown_name_lists_the_known_names():
    losses, _, _ = make()
    with pytest.raises(ValueError, match=r"unknown loss 'DPO'; known: CrossEntropyLoss, grpo"):
        losses.get("DPO")
    with pytest.raises(ValueError, match=r"known: \(none registered\)"):
        Registry("optimizer").get("AdamW")


def test_register_as_a_call_and_twice_for_the_same_class():
    optimizers = Registry("optimizer")

    class AdamW:
        pass

    assert optimizers.register(AdamW) is AdamW
    assert optimizers.register(AdamW) is AdamW
    assert optimizers.names() == ["AdamW"]


def test_a_taken_name_is_not_silently_replaced():
    losses, ce, _ = make()

    class CrossEntropyLoss(Loss):
        pass

    with pytest.raises(ValueError, match="already taken"):
        losses.register(CrossEntropyLoss)
    assert losses.get("CrossEntropyLoss") is ce


def test_entries_must_be_classes_of_the_base():
    losses, _, _ = make()

    class NotALoss:
        pass

    with pytest.raises(TypeError, match="must subclass Loss"):
        losses.register(NotALoss)
    with pytest.raises(TypeError, match="must subclass Loss"):
        losses.get(NotALoss)
    with pytest.raises(TypeError, match="must be a class"):
        losses.register(Loss())
    with pytest.raises(TypeError, match="by name or class"):
        losses.get(3)
    with pytest.raises(ValueError, match="non-empty strings"):
        losses.register(Loss, name="")


def test_registering_exports_needs_a_base_and_takes_only_its_subclasses():
    class Base:
        pass

    class Child(Base):
        pass

    module = types.ModuleType("exports")
    module.Base, module.Child, module.helper = Base, Child, len
    module.__all__ = ["Base", "Child", "helper"]
    registry = Registry("widget", base=Base)
    registry.register_exported(module)
    assert registry.names() == ["Child"]
    with pytest.raises(TypeError, match="no base class"):
        Registry("widget").register_exported(module)
