"""The proxies implement exactly the methods and parameters of the remote API table, and the
model proxy's methods made from it show, check and encode what the table says."""

import inspect

import pytest

from twinkle.data_format import ModelOutput
from twinkle_client._proxies import add_model_methods
from twinkle_client.api import CLIENT_EXTRAS, REMOTE_API, SPECIFICATION
from twinkle_client.dataloader import DataLoader
from twinkle_client.dataset import Dataset
from twinkle_client.model import MultiLoraTransformersModel
from twinkle_client.sampler import vLLMSampler

PROXIES = {
    "model": MultiLoraTransformersModel,
    "sampler": vLLMSampler,
    "dataset": Dataset,
    "dataloader": DataLoader,
}


def proxy_parameters(component: str, method: str) -> list[str]:
    func = getattr(PROXIES[component], method)
    extras = set(CLIENT_EXTRAS.get(f"{component}.{method}", []))
    names = []
    for param in inspect.signature(func).parameters.values():
        if param.name == "self" or param.name in extras:
            continue
        if param.name == "adapter_name" and param.kind is param.KEYWORD_ONLY:
            continue  # the proxy's way to pick an adapter, as the local model's
        names.append("**" if param.kind is param.VAR_KEYWORD else param.name)
    return names


@pytest.mark.parametrize(
    ("component", "method"),
    [(c, m) for c, methods in REMOTE_API.items() for m in methods],
)
def test_proxy_method_matches_the_table(component, method):
    assert proxy_parameters(component, method) == REMOTE_API[component][method]


class RecordingClient:
    """Answers each call with ``answer`` and keeps the path and body it was sent."""

    def __init__(self, answer=None):
        self.answer = answer
        self.calls = []

    def call(self, path, body):
        self.calls.append((path, body))
        return self.answer


def proxy(answer=None):
    model = MultiLoraTransformersModel(client=RecordingClient(answer))
    model.runs = {"default": "run-1"}
    return model


def test_made_methods_show_the_local_signature_and_docstring():
    sig = inspect.signature(MultiLoraTransformersModel.forward_backward)
    assert list(sig.parameters) == [
        "self",
        "inputs",
        "adapter_name",
        "micro_batch_size",
        "task",
        "routing_replay",
        "loss_kwargs",
    ]
    assert sig.parameters["task"].default == "causal_lm"
    assert sig.parameters["adapter_name"].kind is inspect.Parameter.KEYWORD_ONLY
    doc = SPECIFICATION["model"]["forward_backward"]["doc"]
    assert doc.startswith("Forward, loss and backward")
    assert MultiLoraTransformersModel.forward_backward.__doc__ == doc
    assert MultiLoraTransformersModel.step.__qualname__ == "MultiLoraTransformersModel.step"


def test_a_made_method_encodes_as_its_wire_policy_says():
    class CrossEntropyLoss:  # a class travels as its name
        pass

    model = proxy()
    model.set_loss(CrossEntropyLoss, reduction="sum")
    model.set_template("Qwen3Template", model_id="elsewhere", max_length=64)
    model.clip_grad_and_step(0.5)
    assert model.client.calls == [
        (
            "/model/set_loss",
            {"training_run_id": "run-1", "args": {"loss": "CrossEntropyLoss", "reduction": "sum"}},
        ),
        (
            "/model/set_template",
            {"training_run_id": "run-1", "args": {"template": "Qwen3Template", "max_length": 64}},
        ),
        ("/model/clip_grad_and_step", {"training_run_id": "run-1", "args": {"max_grad_norm": 0.5}}),
    ]
    with pytest.raises(TypeError, match="objects cannot be sent"):
        model.set_loss(CrossEntropyLoss())


def test_a_made_method_refuses_a_wrong_argument_before_any_request():
    model = proxy()
    with pytest.raises(TypeError, match="max_nrom"):
        model.clip_grad_norm(max_nrom=1.0)
    with pytest.raises(TypeError):
        model.step(1)
    assert model.client.calls == []


def test_batch_methods_send_rows_and_return_a_model_output():
    model = proxy({"loss": 0.25})
    output = model.forward_only({"input_ids": [1, 2, 3]}, task="causal_lm")
    assert isinstance(output, ModelOutput) and output.loss == 0.25
    ((path, body),) = model.client.calls
    assert path == "/model/forward_only"
    assert body["args"] == {"inputs": [{"input_ids": [1, 2, 3]}], "task": "causal_lm"}


def test_a_new_table_entry_is_a_new_proxy_method():
    """What adding a method costs the client: nothing but the table's entry (written by
    the server package from the method's ``@remote_function(wire=...)``)."""

    class Proxy:
        def __init__(self):
            self.sent = []

        def _call(self, method, adapter_name, **args):
            self.sent.append((method, adapter_name, args))
            return 2.0

    entry = {
        "params": [{"name": "scale", "kind": "positional", "default": 1.0}],
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
    add_model_methods(Proxy, {"rescale": entry})
    assert str(inspect.signature(Proxy.rescale)) == "(self, scale=1.0, *, adapter_name=None)"
    assert Proxy.rescale.__doc__ == entry["doc"]
    assert Proxy().rescale() == 2.0
    client = Proxy()
    client.rescale(3.0, adapter_name="a")
    assert client.sent == [("rescale", "a", {"scale": 3.0})]
