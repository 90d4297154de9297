"""parallelize: apply the DeviceMesh's strategies to a plain model, in torchtitan's order.

NOTE the order: every rank first takes rank 0's weights, while each holds the whole
model; then expert parallel (shards experts and their FSDP over ``ep_fsdp``), then
Ulysses sequence parallel or context parallel (patch attention), then tensor parallel
(splits layers over ``tp``), then activation checkpointing, then FSDP2 or DDP, which must
come last as they wrap (or shard) whatever the others left; FSDP2 shards tp's DTensors over
dp × fsdp, and over fsdp × cp under context parallel.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from twinkle.mesh import DeviceMesh
from twinkle.model.transformers.moe import expert_parameters, sync_expert_gradients
from twinkle.model.transformers.strategy.context_parallel import ContextParallelStrategy
from twinkle.model.transformers.strategy.ddp import apply_ddp, set_ddp_gradient_sync
from twinkle.model.transformers.strategy.fsdp import apply_fsdp, set_fsdp_gradient_sync
from twinkle.model.transformers.strategy.grads import clip_grad_norm
from twinkle.model.transformers.strategy.pipeline import (
    PipelineConfig,
    PipelinePlan,
    check_pipeline,
)
from twinkle.model.transformers.strategy.sequence_parallel import (
    SequenceParallelStrategy,
    SequenceShard,
)
from twinkle.model.transformers.strategy.state_dict import full_model_state_dict
from twinkle.model.transformers.strategy.tensor_parallel import (
    TensorParallel,
    apply_tensor_parallel,
    check_tensor_parallel,
)

SUPPORTED_DIMS = ("pp", "dp", "fsdp", "cp", "tp")
KINDS = ("single", "ddp", "fsdp", "hsdp", "tp", "pp")


class ParallelPlan:
    """What ``parallelize`` applied to a model, and the per-step operations that depend on it.

    ``run(unit, fn, ...)`` runs a forward through the strategy's root so DDP or FSDP
    hooks see it; ``set_gradient_sync`` turns the gradient reduction of the next
    backward on or off; ``all_reduce_sum`` totals a number over the data-parallel ranks;
    ``gradient_ranks`` is how many ranks DDP/FSDP average gradients over. Under pipeline
    parallel ``pipeline`` (a ``PipelinePlan``) runs the micro-batches through the stages
    and answers the hooks below for them.

    The model's training step asks the plan wherever a strategy changes what it computes:
    ``prepare_batch`` and ``finish_outputs`` / ``finish_router_logits`` around a forward
    (Ulysses SP runs a slice of the sequence and gathers the outputs), ``reports_metrics``
    (SP peers share one batch), ``global_tokens`` and ``tokens_per_rank`` (the normaliser:
    SP peers count their batch once) and ``reduce_extra_gradients`` (expert-parallel
    weights, which DDP leaves out).
    """

    def __init__(
        self,
        model: nn.Module,
        kind: str,
        *,
        group: dist.ProcessGroup | None = None,
        fsdp_root: nn.Module | None = None,
        ddp_config: Mapping[str, Any] | None = None,
        sequence_parallel: SequenceParallelStrategy | None = None,
        tensor_parallel: TensorParallel | None = None,
        pipeline: PipelinePlan | None = None,
    ) -> None:
        self.model = model
        self.kind = kind
        self.group = group
        self.fsdp_root = fsdp_root
        self.ddp_config = dict(ddp_config or {})
        self._ddp_roots: dict[str, nn.Module] = {}
        self.sequence_parallel = sequence_parallel
        self.tensor_parallel = tensor_parallel
        self.pipeline = pipeline

    @property
    def distributed(self) -> bool:
        return self.kind != "single"

    @property
    def sharded(self) -> bool:
        """Whether weights are DTensors (FSDP2 or tp) or stages to gather for a checkpoint."""
        return self.kind in ("fsdp", "hsdp", "pp") or self.tensor_parallel is not None

    @property
    def gradient_ranks(self) -> int:
        if self.pipeline is not None:  # FSDP2 averages over the ranks holding a stage
            return self.pipeline.data_ranks
        return dist.get_world_size(self.group) if self.distributed else 1

    def root(self, unit: str) -> nn.Module | None:
        """The module whose forward the trainable ``unit`` (an adapter or the full model) runs
        through. DDP wrappers are built on first use, while ``unit`` is the trainable one."""
        if self.kind == "ddp":
            if unit not in self._ddp_roots:
                self._ddp_roots[unit] = apply_ddp(self.model, self.group, self.ddp_config)
            return self._ddp_roots[unit]
        return self.fsdp_root

    def run(self, unit: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        root = self.root(unit)
        return fn(*args, **kwargs) if root is None else root(fn, *args, **kwargs)

    def set_gradient_sync(self, unit: str, sync: bool) -> None:
        if self.kind == "ddp":
            set_ddp_gradient_sync(self.root(unit), sync)
        elif self.fsdp_root is not None:
            set_fsdp_gradient_sync(self.fsdp_root, sync)

    # ---- hooks of the training step ----------------------------------------------------

    @property
    def splits_sequences(self) -> bool:
        """Whether a forward runs a slice of each sequence on this rank (Ulysses SP)."""
        return self.sequence_parallel is not None

    def prepare_batch(self, batch: dict) -> tuple[dict, SequenceShard] | None:
        """The model inputs this rank runs for ``batch`` and the part they are of, which
        ``finish_outputs`` turns back into the whole batch's outputs; None when the rank runs
        the batch as it is. Under Ulysses SP: this rank's slice of the sequence."""
        if self.sequence_parallel is None:
            return None
        embed_dtype = _hf_model(self.model).get_input_embeddings().weight.dtype
        return self.sequence_parallel.shard(batch, embed_dtype)

    def finish_outputs(self, part: SequenceShard, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        """The batch's outputs (``{'logps', 'pred_ids'}`` with labels, else ``{'logits'}``)
        from the logits of the ``part`` that ``prepare_batch`` gave this rank."""
        return part.outputs(logits)

    def finish_router_logits(
        self, part: SequenceShard | None, router_logits: list[torch.Tensor]
    ) -> list[torch.Tensor]:
        """Each MoE layer's router logits for the whole batch, from those of this rank's
        ``part`` (None: the batch was run whole, and they are returned as they are)."""
        return router_logits if part is None else part.full_router_logits(router_logits)

    @property
    def reports_metrics(self) -> bool:
        """Whether this rank counts its batch in the metrics: Ulysses peers hold one batch
        between them, and one of them counts it."""
        if self.pipeline is not None:  # the last stage scores the batch
            return self.pipeline.reports
        return self.sequence_parallel is None or self.sequence_parallel.rank == 0

    def global_tokens(self, local_tokens: float) -> float:
        """The global batch's token count from each rank's own count: summed over the ranks,
        with a batch that Ulysses peers each counted counted once. A collective."""
        tokens = self.all_reduce_sum(local_tokens)
        return tokens / (self.sequence_parallel.size if self.sequence_parallel is not None else 1)

    def tokens_per_rank(self) -> float:
        """Each rank's share of a global token count of 1: what ``global_tokens`` totals to
        1 when every rank passes it (``step_with(normalise=False)``)."""
        if self.pipeline is not None:  # global_tokens sums every rank's count
            return 1 / dist.get_world_size()
        peers = self.sequence_parallel.size if self.sequence_parallel is not None else 1
        return peers / self.gradient_ranks

    def reduce_extra_gradients(self) -> None:
        """The gradient reductions the strategy's wrapper leaves out, after the last backward
        before a step: under DDP, expert-parallel weights (outside DDP) over the ranks holding
        the same experts; under dp × tp (no FSDP), every gradient over dp. A collective."""
        if self.kind in ("ddp", "tp"):
            sync_expert_gradients(_hf_model(self.model))
        if self.tensor_parallel is not None:
            self.tensor_parallel.reduce_gradients()
        if self.kind == "tp" and self.gradient_ranks > 1:  # what DDP does, over dp
            experts = {id(p) for p in expert_parameters(self.model)}
            dense = [p for p in self.model.parameters() if id(p) not in experts]
            self.tensor_parallel.average_over_data(dense, self.group)
        if self.pipeline is not None:  # a tied embedding's copies on the first and last stage
            self.pipeline.reduce_tied_gradient()

    # ---- collectives ----------------------------------------------------------------------

    def all_reduce_sum(self, value: float) -> float:
        if not self.distributed:
            return value
        total = torch.tensor([float(value)], dtype=torch.float64, device=_comm_device(self.group))
        dist.all_reduce(total, group=self.group)
        return float(total)

    def all_reduce_tensor(self, value: torch.Tensor) -> torch.Tensor:
        """Sum of ``value`` over the data-parallel ranks (a new tensor; the input is kept)."""
        if not self.distributed:
            return value
        total = value.detach().to(_comm_device(self.group)).clone()
        dist.all_reduce(total, group=self.group)
        return total.to(value.device)

    def clip_grad_norm(self, params: list[nn.Parameter], max_norm: float) -> float:
        if self.pipeline is not None:  # the norm over every stage's gradients
            return self.pipeline.clip_grad_norm(params, max_norm)
        return clip_grad_norm(params, max_norm)

    # ---- checkpoints ----------------------------------------------------------------------

    @property
    def optimizer_key(self) -> str:
        """The name of this rank's optimizer state in a sharded checkpoint: one per pipeline
        stage (each steps other parameters)."""
        if self.pipeline is None:
            return "optimizer"
        return f"optimizer_stage{self.pipeline.pp_rank}"

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's tensors on rank 0 ({} elsewhere), gathered from its shards and,
        under pipeline parallel, from every stage (a collective)."""
        if self.pipeline is not None:
            return self.pipeline.full_state_dict()
        return full_model_state_dict(self.model)

    def own_weights(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The tensors of a whole checkpoint that this rank holds: a pipeline stage keeps its
        own layers' (the others' keys are not in its model)."""
        if self.pipeline is None:
            return weights
        current = set(self.model.state_dict())
        return {k: v for k, v in weights.items() if k in current}


def _hf_model(model: nn.Module) -> nn.Module:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _comm_device(group: dist.ProcessGroup | None) -> torch.device:
    if dist.get_backend(group) == "gloo":
        return torch.device("cpu")
    module = torch.accelerator.current_accelerator()
    return torch.device(module.type, torch.accelerator.current_device_index())


def check_mesh(device_mesh: DeviceMesh) -> None:
    """A mesh this model can run on, matching the processes torchrun started."""
    extra = [
        f"{name}={size}"
        for name, size in zip(device_mesh.mesh_dim_names, device_mesh.mesh_shape, strict=True)
        if name not in SUPPORTED_DIMS and size > 1
    ]
    if extra:
        raise ValueError(
            f"TransformersModel parallelises over pp, dp, fsdp, cp and tp (with ulysses_size "
            f"and ep_size carved from dp × fsdp); this mesh also has {', '.join(extra)}: drop "
            "them, or use MegatronModel"
        )
    if device_mesh.size("pp") > 1:
        others = [n for n in ("ulysses", "ep") if device_mesh.size(n) > 1]
        if others:
            raise ValueError(
                f"TransformersModel's pipeline parallel combines with dp, fsdp and tp, not with "
                f"{', '.join(f'{n}_size' for n in others)} yet: split the model over tp_size "
                "instead of the sequence or the experts, drop pp_size (Ulysses and expert "
                "parallel run without it), or use MegatronModel for pp with them"
            )
    if device_mesh.size("etp") > 1:
        raise ValueError(
            f"etp_size={device_mesh.etp_size}: TransformersModel keeps every expert whole (the "
            "routed experts split over ep ranks; under tp each tp rank runs its experts for "
            "the same tokens), so experts are not tensor-parallel here; drop etp_size, or use "
            "MegatronModel to split experts over etp"
        )
    if device_mesh.size("cp") > 1:
        others = [n for n in ("pp", "tp", "ulysses", "ep") if device_mesh.size(n) > 1]
        if others:
            raise ValueError(
                f"TransformersModel's context parallel combines with dp and fsdp, not with "
                f"{', '.join(f'{n}_size' for n in others)} yet; drop one of them"
            )
    world = device_mesh.world_size
    names, shape = device_mesh.mesh_dim_names, device_mesh.mesh_shape
    sizes = " × ".join(f"{n}={s}" for n, s in zip(names, shape, strict=True))
    running = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if world != running:
        start = (
            f"torch.distributed runs {running} processes"
            if running > 1
            else "torch.distributed is not started (one process)"
        )
        raise ValueError(
            f"the device mesh has world_size {world} "
            f"({sizes}) "
            f"but {start}: launch with torchrun --nproc_per_node={world} and call "
            f"twinkle.initialize('local', global_device_mesh=mesh), or size the mesh to "
            f"{running} process(es)"
        )


def parallelize(
    model: nn.Module,
    device_mesh: DeviceMesh | None,
    *,
    precision: str = "fp32",
    gradient_checkpointing: bool = False,
    ddp_config: Mapping[str, Any] | None = None,
    expert_parallel: Any = None,
    sequence_parallel: Any = None,
    pipeline: PipelineConfig | None = None,
) -> ParallelPlan:
    """Apply the mesh's strategies to ``model`` (a Hugging Face model, peft-wrapped or not).

    FSDP2 when the mesh has fsdp > 1 (HSDP when dp > 1 too), DDP when it has only
    dp > 1, nothing on one process. FSDP2 shards the model in place: build the
    optimizer afterwards. ``expert_parallel`` and ``sequence_parallel`` are the
    ``ExpertParallelConfig`` and ``SequenceParallelConfig`` passed to those strategies
    when the mesh has ``ep_size`` or ``ulysses_size`` > 1; ``pipeline`` the
    ``PipelineConfig`` of a mesh with ``pp_size`` > 1 (``strategy.pipeline``).
    """
    pipeline = pipeline or PipelineConfig()
    if device_mesh is not None:
        if device_mesh.size("tp") > 1:  # before any collective, so every rank says why
            tp, ulysses = device_mesh.size("tp"), device_mesh.size("ulysses")
            check_tensor_parallel(_hf_model(model).config, tp, ulysses)
        if device_mesh.size("pp") > 1:
            check_pipeline(_hf_model(model).config, device_mesh, pipeline)
        check_mesh(device_mesh)
    if device_mesh is None or device_mesh.world_size == 1:
        _enable_activation_checkpointing(model, gradient_checkpointing)
        return ParallelPlan(model, "single")
    broadcast_from_rank0(model)
    if device_mesh.size("pp") > 1:
        return _pipelined(model, device_mesh, pipeline, precision, gradient_checkpointing)
    if device_mesh.size("ep") > 1:
        from twinkle.model.transformers.moe.expert_parallel import apply_expert_parallel

        apply_expert_parallel(model, device_mesh, expert_parallel)
    sequence_strategy = None
    if device_mesh.size("ulysses") > 1:
        sequence_strategy = SequenceParallelStrategy(device_mesh, sequence_parallel).apply(model)
    context = device_mesh.size("cp")
    if context > 1:
        sequence_strategy = ContextParallelStrategy(device_mesh, sequence_parallel).apply(model)
    torch_mesh = device_mesh.to_torch()
    tensor_strategy = None
    if device_mesh.size("tp") > 1:
        tensor_strategy = apply_tensor_parallel(model, torch_mesh["tp"])
    _enable_activation_checkpointing(model, gradient_checkpointing)
    dp, fsdp = device_mesh.size("dp"), device_mesh.size("fsdp")
    if fsdp > 1:
        kind = "hsdp" if dp > 1 else "fsdp"
        shard = "fsdp"
        if context > 1:  # cp peers hold partial gradients of one batch: FSDP2 averages them
            shard = "fsdp_cp"
            torch_mesh["fsdp", "cp"]._flatten(shard)  # NOTE: private; torchtitan does the same
        shard_mesh = torch_mesh["dp", shard] if dp > 1 else torch_mesh[shard]
        root = apply_fsdp(model, shard_mesh, precision)
        return ParallelPlan(
            model,
            kind,
            group=dist.group.WORLD if tensor_strategy is None else _data_group(device_mesh),
            fsdp_root=root,
            sequence_parallel=sequence_strategy,
            tensor_parallel=tensor_strategy,
        )
    if tensor_strategy is not None:  # dp × tp: gradients averaged over dp once per step
        return ParallelPlan(
            model,
            "tp",
            group=torch_mesh["dp"].get_group(),
            sequence_parallel=sequence_strategy,
            tensor_parallel=tensor_strategy,
        )
    return ParallelPlan(
        model,
        "ddp",
        group=dist.group.WORLD if context > 1 else torch_mesh["dp"].get_group(),
        ddp_config=ddp_config,
        sequence_parallel=sequence_strategy,
    )


def _pipelined(
    model: nn.Module,
    device_mesh: DeviceMesh,
    pipeline: PipelineConfig,
    precision: str,
    gradient_checkpointing: bool,
) -> ParallelPlan:
    """Pipeline stages over ``pp``, each split over tp and sharded by FSDP2 over dp × fsdp."""
    _enable_activation_checkpointing(model, gradient_checkpointing)
    device = next(model.parameters()).device
    stages = PipelinePlan(model, device_mesh, pipeline, device, precision)
    stages.build()
    return ParallelPlan(
        model,
        "pp",
        group=dist.group.WORLD,
        tensor_parallel=stages.tensor_parallel,
        pipeline=stages,
    )


def _data_group(device_mesh: DeviceMesh) -> dist.ProcessGroup:
    """The ranks reading different batches as this one (equal tp coordinate), over which
    token counts are summed. Every rank creates every group, as ``new_group`` requires."""
    groups: dict[int, list[int]] = {}
    for rank in range(device_mesh.world_size):
        groups.setdefault(device_mesh.coords(rank)["tp"], []).append(rank)
    mine = None
    for ranks in groups.values():
        group = dist.new_group(ranks)
        if dist.get_rank() in ranks:
            mine = group
    return mine


def broadcast_from_rank0(model: nn.Module) -> None:
    """Make every rank's weights rank 0's, as DDP does when it wraps, while each rank still
    holds the whole model: a LoRA adapter is initialised from each process's own random
    generator, and sharding (FSDP) or splitting (experts) tensors that differ across ranks
    would stitch one model from several."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0)


def _enable_activation_checkpointing(model: nn.Module, enabled: bool) -> None:
    if not enabled:
        return
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
