"""MultiLoraTransformersModel, remotely: the local model's methods, run on the server.

Each ``add_adapter_to_model`` takes a LoRA slot on the server and starts a training run;
the other methods act on an adapter by ``adapter_name`` (the only one, or ``'default'``,
when omitted), exactly as on a local TransformersModel. Losses, optimizers, schedulers,
templates and processors are named (the server builds them from its allow-list).
Every method but the adapter bookkeeping is made from the remote API table
(``twinkle_client.api``), with the local method's signature and docstring.
"""

from __future__ import annotations

from typing import Any

from twinkle_client._proxies import add_model_methods
from twinkle_client._wire import clean, lora_dict
from twinkle_client.api import SPECIFICATION
from twinkle_client.manager import TwinkleClient, get_client


class MultiLoraTransformersModel:
    """A proxy of the server's model. ``model_id`` must name the model the server serves
    (or be None)."""

    def __init__(
        self, model_id: str | None = None, *, client: TwinkleClient | None = None, **unused: Any
    ) -> None:
        self.model_id = model_id
        self.client = get_client(client)
        self.runs: dict[str, str] = {}  # adapter name -> training run id

    # ---- plumbing -----------------------------------------------------------------------

    def training_run_id(self, adapter_name: str | None = None) -> str:
        if adapter_name is not None:
            if adapter_name not in self.runs:
                known = ", ".join(self.runs) or "none: call add_adapter_to_model first"
                raise ValueError(f"unknown adapter {adapter_name!r}; adapters: {known}")
            return self.runs[adapter_name]
        if len(self.runs) == 1:
            return next(iter(self.runs.values()))
        if "default" in self.runs:
            return self.runs["default"]
        if not self.runs:
            raise ValueError("the model has no adapter: call add_adapter_to_model first")
        raise ValueError(
            f"this model has several adapters ({', '.join(self.runs)}): pass adapter_name="
        )

    def _call(self, method: str, adapter_name: str | None, **args: Any) -> Any:
        body = {"training_run_id": self.training_run_id(adapter_name), "args": clean(args)}
        return self.client.call(f"/model/{method}", body)

    # ---- adapters (their own routes) ---------------------------------------------------

    def add_adapter_to_model(
        self, adapter_name: str, config_or_path: Any, gradient_accumulation_steps: int = 1
    ) -> None:
        if adapter_name in self.runs:
            raise ValueError(f"adapter {adapter_name!r} already exists; pick another name")
        body = {
            "session_id": self.client.session_id,
            "adapter_name": adapter_name,
            "config": lora_dict(config_or_path),
            "gradient_accumulation_steps": gradient_accumulation_steps,
            "model_id": self.model_id,
        }
        result = self.client.call("/model/add_adapter_to_model", clean(body))
        self.runs[adapter_name] = result["training_run_id"]

    def remove_adapter(self, adapter_name: str | None = None) -> None:
        """Free the adapter's LoRA slot on the server (its checkpoints stay)."""
        run_id = self.training_run_id(adapter_name)
        self.client.call("/model/remove_adapter", {"training_run_id": run_id})
        self.runs = {name: run for name, run in self.runs.items() if run != run_id}


add_model_methods(MultiLoraTransformersModel, SPECIFICATION["model"])
