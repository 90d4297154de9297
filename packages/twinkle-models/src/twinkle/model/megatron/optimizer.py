"""``set_optimizer`` names mapped onto Megatron's optimizer, which owns fp32 main weights.

Megatron's optimizer reads the gradients its DDP wrapper accumulated in fp32
buffers, keeps fp32 master weights under bf16/fp16 training, and can shard its
state across data-parallel ranks (the distributed optimizer). It wraps two torch
algorithms: AdamW (Megatron's 'adam', decoupled weight decay) and SGD with
momentum; other optimizer names cannot be wrapped and are refused by name.
Like ``build_optimizer``, weight decay skips biases and 1-D parameters (norm scales).
"""

from __future__ import annotations

from typing import Any

import torch

# twinkle name -> Megatron's optimizer name
SUPPORTED = {"default": "adam", "AdamW": "adam", "SGD": "sgd"}


def optimizer_name(optimizer_cls: Any) -> str:
    """The Megatron optimizer for a twinkle name or torch class; an error names what works."""
    name = optimizer_cls.__name__ if isinstance(optimizer_cls, type) else optimizer_cls
    if name not in SUPPORTED:
        raise ValueError(
            f"MegatronModel cannot use optimizer {name!r}: Megatron's optimizer wraps "
            f"{', '.join(repr(n) for n in SUPPORTED)} ('default' is AdamW); pick one of them"
        )
    return SUPPORTED[name]


def build_megatron_optimizer(
    chunks: list[torch.nn.Module],
    optimizer_cls: Any,
    precision: str,
    use_distributed_optimizer: bool,
    lr: float = 1e-5,
    weight_decay: float = 0.01,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    momentum: float = 0.9,
    **unknown: Any,
):
    """Megatron's optimizer over the DDP-wrapped ``chunks``; arguments use torch's names."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    name = optimizer_name(optimizer_cls)
    if unknown:
        raise TypeError(
            f"set_optimizer got arguments MegatronModel does not map: {sorted(unknown)}; it "
            "takes lr, weight_decay, betas, eps (AdamW) and momentum (SGD)"
        )
    config = OptimizerConfig(
        optimizer=name,
        lr=lr,
        weight_decay=weight_decay,
        adam_beta1=betas[0],
        adam_beta2=betas[1],
        adam_eps=eps,
        sgd_momentum=momentum,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        params_dtype={"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32),
        use_distributed_optimizer=use_distributed_optimizer,
        clip_grad=0.0,  # clip_grad_and_step clips with the norm the caller passes
    )
    optimizer = get_megatron_optimizer(config, chunks)
    _count_expert_replicas_once(optimizer)
    return optimizer


def _count_expert_replicas_once(optimizer) -> None:
    """NOTE: megatron-core 0.16 gives the expert parameters' optimizer the dense
    tensor-parallel group as ``tp_group`` (optimizer/__init__.py), by whose rank 0 the
    gradient norm counts a parameter that is not tensor-parallel. Expert parameters are
    replicated over the expert-tensor-parallel group instead, so a replicated expert
    parameter (a LoRA factor on the experts) would be counted etp times, or on one
    tensor-parallel rank only. The expert optimizer gets the expert group."""
    from megatron.core import parallel_state

    for inner in _inner_optimizers(optimizer):
        groups = inner.optimizer.param_groups
        if groups and groups[0].get("is_expert_parallel"):
            inner.tp_group = parallel_state.get_expert_tensor_parallel_group()


def torch_optimizers(optimizer) -> list[torch.optim.Optimizer]:
    """The torch optimizers inside a Megatron optimizer (chained for expert/dense groups)."""
    return [o.optimizer for o in _inner_optimizers(optimizer)]


def clip_gradients(optimizer, max_norm: float) -> float:
    """The global gradient norm over every torch optimizer inside ``optimizer`` (dense and
    expert parameters), after scaling the gradients down to ``max_norm`` (0: no clipping)."""
    from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

    norm = optimizer.get_grad_norm()
    if max_norm > 0:
        for inner in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
            params = inner.get_parameters()
            if params:
                decoupled = inner.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8
                clip_grad_by_total_norm_fp32(params, max_norm, norm, decoupled)
    return float(norm)


class SchedulerGroup:
    """One lr scheduler per torch optimizer inside Megatron's (dense and expert parameter
    groups of a mixture-of-experts model), stepped and saved together."""

    def __init__(self, schedulers: list) -> None:
        self.schedulers = schedulers

    def step(self) -> None:
        for scheduler in self.schedulers:
            scheduler.step()

    def get_last_lr(self) -> list[float]:
        return self.schedulers[0].get_last_lr()

    def state_dict(self) -> dict:
        return {"schedulers": [s.state_dict() for s in self.schedulers]}

    def load_state_dict(self, state: dict) -> None:
        for scheduler, saved in zip(self.schedulers, state["schedulers"], strict=True):
            scheduler.load_state_dict(saved)


def _inner_optimizers(optimizer) -> list:
    """The Megatron optimizers inside ``optimizer`` that hold parameters (megatron-core
    chains an empty one, whose torch optimizer is None, when every trainable parameter is
    an expert's or none is)."""
    inner = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    return [o for o in inner if getattr(o, "optimizer", None) is not None]


def optimizer_state(optimizer) -> list[dict]:
    """This rank's optimizer state, one entry per inner optimizer, for a same-layout resume.

    Megatron's distributed optimizer leaves the per-parameter state (fp32 main weights,
    moments) out of ``state_dict()``, since it is sharded over data-parallel ranks; it is
    added here in the optimizer's own bucket order (``dp_reshardable``), so each rank saves
    and restores exactly its shard.
    """
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    states = []
    for inner in _inner_optimizers(optimizer):
        state = {"state_dict": None, "param_state": None}
        if isinstance(inner, DistributedOptimizer):
            if inner.optimizer.state:  # NOTE: state_dict() needs a step to have run
                state["state_dict"] = inner.state_dict()
                param_state = inner.get_parameter_state_dp_reshardable()
                for buffers in (v for k, v in param_state.items() if isinstance(k, int)):
                    for buckets in buffers.values():
                        for bucket in buckets:
                            for tensors in bucket:
                                tensors["padding"] = False  # whole parameters, no padding
                state["param_state"] = param_state
        else:
            state["state_dict"] = inner.state_dict()
        states.append(state)
    return states


@torch.no_grad()  # NOTE: the main weights are leaves that require grad; they are set in place
def load_optimizer_state(optimizer, states: list[dict]) -> None:
    """Restore what ``optimizer_state`` saved (same layout, same optimizer set-up)."""
    inners = _inner_optimizers(optimizer)
    if len(states) != len(inners):
        raise ValueError(
            f"the checkpoint holds {len(states)} optimizer states and this model's optimizer "
            f"has {len(inners)}: set the optimizer up as the run that saved it did"
        )
    for inner, state in zip(inners, states, strict=True):
        saved = state["state_dict"]
        if saved is None:
            continue
        if state["param_state"] is not None:
            saved = {
                **saved,
                "param_state": state["param_state"],
                "param_state_sharding_type": "dp_reshardable",
            }
        inner.load_state_dict(saved)
        _unshare_steps(inner.optimizer)


def _unshare_steps(torch_optimizer: torch.optim.Optimizer) -> None:
    """NOTE: without Transformer Engine or apex, megatron-core 0.16's distributed optimizer
    loads one ``step`` tensor into every parameter's state; torch's AdamW increments each
    parameter's step in place, so a shared one would advance once per parameter per step
    and skew the bias correction. Each parameter gets its own copy."""
    for state in torch_optimizer.state.values():
        if torch.is_tensor(state.get("step")):
            state["step"] = state["step"].clone()
