"""MultiLoraTransformersModel, remotely: the local model's methods, run on the server.

Each ``add_adapter_to_model`` takes a LoRA slot on the server and starts a training run;
the other methods act on an adapter by ``adapter_name`` (the only one, or ``'default'``,
when omitted), exactly as on a local TransformersModel. Losses, optimizers, schedulers,
templates and processors are named (the server builds them from its allow-list).
"""

from __future__ import annotations

from typing import Any

from twinkle.data_format import ModelOutput, sampled_input_features
from twinkle_client._wire import clean, lora_dict, name_of
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

    # ---- adapters and components ------------------------------------------------------

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

    def set_loss(self, loss: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        self._call("set_loss", adapter_name, loss=name_of(loss, "loss"), **kwargs)

    def set_optimizer(
        self, optimizer_cls: Any = "AdamW", *, adapter_name: str | None = None, **kwargs: Any
    ) -> None:
        name = name_of(optimizer_cls, "optimizer")
        self._call("set_optimizer", adapter_name, optimizer_cls=name, **kwargs)

    def set_lr_scheduler(
        self,
        scheduler_cls: Any = "CosineWarmupScheduler",
        *,
        adapter_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        name = name_of(scheduler_cls, "lr scheduler")
        self._call("set_lr_scheduler", adapter_name, scheduler_cls=name, **kwargs)

    def set_template(
        self, template: Any, *, adapter_name: str | None = None, **kwargs: Any
    ) -> None:
        kwargs.pop("model_id", None)  # the server always uses its own model's tokenizer
        self._call("set_template", adapter_name, template=name_of(template, "template"), **kwargs)

    def set_processor(
        self, processor: Any, *, adapter_name: str | None = None, **kwargs: Any
    ) -> None:
        self._call(
            "set_processor", adapter_name, processor=name_of(processor, "processor"), **kwargs
        )

    # ---- training -----------------------------------------------------------------------

    def forward_backward(
        self,
        inputs: Any,
        *,
        adapter_name: str | None = None,
        micro_batch_size: int | None = None,
        task: str = "causal_lm",
        **loss_kwargs: Any,
    ) -> ModelOutput:
        result = self._call(
            "forward_backward",
            adapter_name,
            inputs=_batch(inputs),
            micro_batch_size=micro_batch_size,
            task=task,
            **loss_kwargs,
        )
        return ModelOutput.from_dict(result)

    def forward_only(
        self,
        inputs: Any,
        *,
        adapter_name: str | None = None,
        task: str = "causal_lm",
        **loss_kwargs: Any,
    ) -> ModelOutput:
        result = self._call(
            "forward_only", adapter_name, inputs=_batch(inputs), task=task, **loss_kwargs
        )
        return ModelOutput.from_dict(result)

    def clip_grad_norm(self, max_norm: float = 1.0, *, adapter_name: str | None = None) -> float:
        return self._call("clip_grad_norm", adapter_name, max_norm=max_norm)

    def step(self, *, adapter_name: str | None = None) -> None:
        self._call("step", adapter_name)

    def zero_grad(self, *, adapter_name: str | None = None) -> None:
        self._call("zero_grad", adapter_name)

    def lr_step(self, *, adapter_name: str | None = None) -> None:
        self._call("lr_step", adapter_name)

    def clip_grad_and_step(
        self,
        max_grad_norm: float = 1.0,
        gradient_accumulation_steps: int | None = None,
        *,
        adapter_name: str | None = None,
    ) -> float | None:
        return self._call(
            "clip_grad_and_step",
            adapter_name,
            max_grad_norm=max_grad_norm,
            gradient_accumulation_steps=gradient_accumulation_steps,
        )

    def calculate_metric(
        self, is_training: bool = True, *, adapter_name: str | None = None
    ) -> dict[str, float]:
        return self._call("calculate_metric", adapter_name, is_training=is_training)

    def get_train_configs(self, *, adapter_name: str | None = None) -> str:
        return self._call("get_train_configs", adapter_name)

    # ---- checkpoints --------------------------------------------------------------------

    def save(
        self,
        name: str,
        *,
        adapter_name: str | None = None,
        save_optimizer: bool = True,
        consumed_train_samples: int | None = None,
        overwrite: bool = True,
    ) -> str:
        """Save on the server; returns the checkpoint's ``twinkle://<run>/weights/<name>``."""
        return self._call(
            "save",
            adapter_name,
            name=name,
            save_optimizer=save_optimizer,
            consumed_train_samples=consumed_train_samples,
            overwrite=overwrite,
        )

    def load(
        self, path: str, *, adapter_name: str | None = None, load_optimizer: bool = False
    ) -> None:
        """Load a checkpoint of this key (``twinkle://...``) into the adapter."""
        self._call("load", adapter_name, path=path, load_optimizer=load_optimizer)

    def resume_from_checkpoint(
        self, path: str, resume_only_model: bool = False, *, adapter_name: str | None = None
    ) -> dict[str, int]:
        return self._call(
            "resume_from_checkpoint", adapter_name, path=path, resume_only_model=resume_only_model
        )


def _batch(inputs: Any) -> Any:
    """The rows to send: a sampler's result (what ``vLLMSampler.sample`` returns, here or
    locally) as its sequences' ``new_input_feature``s; one row as a batch of one."""
    sampled = sampled_input_features(inputs)
    if sampled is not None:
        return sampled
    if isinstance(inputs, dict) or hasattr(inputs, "keys"):
        inputs = [inputs]
    return list(inputs)
