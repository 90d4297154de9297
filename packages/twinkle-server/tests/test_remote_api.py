"""One declaration for a remote method: a method offered by its decorator alone reaches the
table with its signature and policy (twinkle-kit's test_remote_api_table checks the client's
shipped copy byte for byte: this package must not import the client)."""

from typing import Any

from twinkle import remote_class, remote_function
from twinkle.infra import WirePolicy
from twinkle.model.transformers.multi_lora import MultiLoraTransformersModel
from twinkle.server.remote_api import (
    describe,
    method_spec,
    wire_methods,
)


def test_the_model_table_is_the_wire_methods_of_the_model():
    offered = wire_methods(MultiLoraTransformersModel)
    assert set(describe()["model"]) == set(offered)
    assert "forward_backward" in offered and "step_with" not in offered  # no wire: local only
    assert offered["clip_grad_norm"].positive == ("max_norm",)
    assert offered["add_adapter_to_model"].own_route


@remote_class(execute="all")
class Toy:
    @remote_function(dispatch="all", collect="first")
    def local_only(self) -> None:
        """Not offered over HTTP."""

    # Adding a remote method is this one decorator argument:
    @remote_function(dispatch="all", collect="first", wire=WirePolicy(positive=("scale",)))
    def rescale(
        self, scale: float = 1.0, *, adapter_name: str | None = None, **extra: Any
    ) -> float:
        """Multiply the adapter's weights by ``scale``."""
        return scale


def test_one_decorator_offers_a_method_with_its_signature_docstring_and_policy():
    offered = wire_methods(Toy)
    assert list(offered) == ["rescale"]
    assert method_spec(Toy.rescale, offered["rescale"]) == {
        "params": [
            {"name": "scale", "kind": "positional", "default": 1.0},
            {"name": "extra", "kind": "var_keyword"},
        ],
        "doc": "Multiply the adapter's weights by ``scale``.",
        "wire": {
            "named": [],
            "batch": None,
            "positive": ["scale"],
            "returns": "json",
            "client_drops": [],
            "own_route": False,
        },
    }
