"""The proxies implement exactly the methods and parameters of the remote API table."""

import inspect

import pytest

from twinkle_client.api import CLIENT_EXTRAS, REMOTE_API
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
