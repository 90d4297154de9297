"""@remote_class / @remote_function in local mode: marks that cost nothing at call time."""

import inspect
import pickle
import types

import pytest

from twinkle import remote_class, remote_function
from twinkle.infra import RemoteClassSpec, RemoteSpec, WirePolicy


@remote_class(execute="all")
class Component:
    def __init__(self, size, **kwargs):
        self.size = size
        self.init_kwargs = kwargs
        self.group_seen_in_init = self.remote_group

    @remote_function(dispatch="slice_dp", collect="mean", lazy_collect=False)
    def step(self, batch):
        return len(batch) * self.size


def test_remote_function_returns_the_same_function_with_its_spec():
    def forward(self, batch):
        return batch

    marked = remote_function(dispatch="all", execute="first", collect="flatten", sync=True)(forward)
    assert marked is forward
    assert forward.__twinkle_remote__ == RemoteSpec("all", "first", "flatten", True, None)


def test_a_marked_method_is_a_plain_method_call():
    component = Component(3)
    assert component.step([1, 2]) == 6
    method = Component.__dict__["step"]
    assert isinstance(method, types.FunctionType) and not hasattr(method, "__wrapped__")
    assert Component.step.__twinkle_remote__.collect == "mean"
    assert Component.step.__twinkle_remote__.lazy_collect is False


def test_construction_is_local_and_keeps_the_class():
    component = Component(2, name="x")
    assert type(component) is Component
    assert Component.__mro__ == (Component, object)
    assert component.size == 2 and component.init_kwargs == {"name": "x"}
    assert component.remote_group is None
    assert Component.__twinkle_remote_class__ == RemoteClassSpec("all")


def test_remote_group_is_stripped_before_init_and_stored():
    component = Component(2, remote_group="model", name="x")
    assert component.init_kwargs == {"name": "x"}
    assert component.remote_group == "model"
    assert component.group_seen_in_init == "model"


def test_remote_group_must_be_a_group_name():
    with pytest.raises(TypeError, match="name of a DeviceGroup"):
        Component(2, remote_group=3)


def test_a_class_without_init_accepts_remote_group_only():
    @remote_class()
    class Bare:
        pass

    assert Bare(remote_group="g").remote_group == "g"
    assert Bare.__twinkle_remote_class__.execute == "first"
    with pytest.raises(TypeError):
        Bare(1)


def test_subclass_with_its_own_init_accepts_remote_group():
    class Child(Component):
        def __init__(self, extra, *, scale=1):
            super().__init__(extra * scale, tag="child")
            self.extra = extra

    child = Child(4, scale=2, remote_group="model")
    assert (child.extra, child.size, child.init_kwargs) == (4, 8, {"tag": "child"})
    assert child.remote_group == "model"
    assert child.step([0]) == 8

    class GrandChild(Child):
        pass

    class GreatGrandChild(GrandChild):
        def __init__(self):
            super().__init__(1)

    assert GrandChild(1, remote_group="a").remote_group == "a"
    assert GreatGrandChild(remote_group="b").remote_group == "b"
    assert GreatGrandChild().remote_group is None


def test_redecorating_a_subclass_changes_only_its_spec():
    @remote_class(execute="first")
    class Loader(Component):
        def __init__(self):
            super().__init__(1)

    assert Loader.__twinkle_remote_class__.execute == "first"
    assert Component.__twinkle_remote_class__.execute == "all"
    assert Loader(remote_group="data").remote_group == "data"


def test_an_existing_init_subclass_hook_still_runs_with_its_arguments():
    registered = {}

    @remote_class()
    class Base:
        def __init_subclass__(cls, tag=None, **kwargs):
            super().__init_subclass__(**kwargs)
            registered[tag] = cls

    class Tagged(Base, tag="t"):
        def __init__(self, value):
            self.value = value

    assert registered == {"t": Tagged}
    assert Tagged(5, remote_group="g").value == 5


@remote_class()
class PicklableBase:
    def __init__(self, value):
        self.value = value


@remote_class()
class Picklable(PicklableBase):
    def __init__(self, value):
        # the explicit form on purpose: the class object must stay the one its name refers to
        super(Picklable, self).__init__(value)  # noqa: UP008


def test_explicit_two_argument_super_and_pickling_keep_working():
    instance = Picklable(7, remote_group="model")
    assert instance.value == 7
    copy = pickle.loads(pickle.dumps(instance))
    assert (type(copy), copy.value, copy.remote_group) == (Picklable, 7, "model")


def test_signature_is_the_users():
    assert list(inspect.signature(Component).parameters) == ["size", "kwargs"]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"dispatch": "split"}, ValueError, "'slice', 'all', 'slice_dp'"),
        ({"collect": "avg"}, ValueError, "'none', 'flatten', 'mean', 'sum', 'first', 'last_pp'"),
        ({"execute": "each"}, ValueError, "'first', 'all'"),
        ({"sync": "yes"}, TypeError, "sync must be True or False"),
        ({"lazy_collect": 1}, TypeError, "lazy_collect must be True, False or None"),
    ],
)
def test_bad_remote_function_arguments_fail_at_decoration(kwargs, error, message):
    with pytest.raises(error, match=message):
        remote_function(**kwargs)


def test_bad_uses_of_the_decorators():
    with pytest.raises(ValueError, match="'first', 'all'"):
        remote_class(execute="some")
    with pytest.raises(TypeError, match="decorates a class"):
        remote_class()(lambda: None)
    with pytest.raises(TypeError, match="decorates a method"):
        remote_function()(42)
    with pytest.raises(TypeError):
        remote_function(lambda self: None)  # the arguments are keyword-only


def test_a_wire_policy_is_checked_against_the_method_where_it_is_declared():
    def clip(self, max_norm=1.0, *, adapter_name=None):
        return max_norm

    policy = WirePolicy(positive=("max_norm",))
    assert remote_function(wire=policy)(clip).__twinkle_remote__.wire is policy
    with pytest.raises(ValueError, match=r"names \['max_nrom'\], which it does not take"):
        remote_function(wire=WirePolicy(positive=("max_nrom",)))(clip)
    with pytest.raises(ValueError, match="returns must be one of"):
        WirePolicy(returns="tensor")
    with pytest.raises(TypeError, match="wire must be a WirePolicy"):
        remote_function(wire={"positive": ("max_norm",)})
