"""Pipeline parallel for TransformersModel with ``torch.distributed.pipelining``.

The decoder's layers are split into ``pp × vpp`` stages (``pipeline_split``), each rank keeps
the modules of its own stages (``pipeline_stage``) and torch's schedules run the micro-batches
through them: GPipe or 1F1B with one stage per rank, interleaved 1F1B with ``vpp_size``
stages per rank. With ``tp_size`` each stage's layers split over its tp ranks by the family's
tensor-parallel plan (DTensors on the stage's tp sub-mesh; every tp rank of a stage runs the
same micro-batches, sends whole hidden states to the same tp rank of the next stage); then
FSDP2 (HSDP with dp × fsdp) shards each stage over the ranks that hold the same stage and tp
coordinate.

The losses are the ones one process computes: the last stage scores each micro-batch's
logits with the unit's loss (a SUM over its tokens, so the schedule does not scale the
gradients) and its first tp rank counts its tokens, and the step divides by the global batch's
token count as every other strategy does. Only the last stage has outputs (``collect='rows'`` and
``'last_pp'`` read it); the loss and token count of a call reach every stage.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from peft import get_peft_model_state_dict
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, schedules
from torch.distributed.tensor import DTensor

from twinkle.mesh import DeviceMesh
from twinkle.model.families import family_of, known_families, model_type_of
from twinkle.model.transformers.strategy.fsdp import mixed_precision_policy
from twinkle.model.transformers.strategy.grads import clip_grad_norm, global_grad_norm
from twinkle.model.transformers.strategy.pipeline_split import stage_layers
from twinkle.model.transformers.strategy.pipeline_stage import DecoderChunk, build_chunks
from twinkle.model.transformers.strategy.tensor_parallel import (
    TensorParallel,
    apply_tensor_parallel,
)

SINGLE = {"GPipe": schedules.ScheduleGPipe, "1F1B": schedules.Schedule1F1B}
MULTI = {"Interleaved1F1B": schedules.ScheduleInterleaved1F1B}


@dataclass(frozen=True)
class PipelineConfig:
    """How TransformersModel pipelines the model over the mesh's ``pp`` (and ``vpp``).

    ``schedule``: 'GPipe' or '1F1B' (the default) with one stage per rank; with
    ``vpp_size`` on the mesh 'Interleaved1F1B' (the only one). ``split``: the number of
    decoder layers of each stage (pp × vpp counts), instead of the split balanced by
    parameter count. ``micro_batches``: how many micro-batches a call cuts its rows into
    when ``forward_backward`` gets no ``micro_batch_size`` (default: the number of stages
    when it divides the rows, else one row each).
    """

    schedule: str | None = None
    split: tuple[int, ...] | None = None
    micro_batches: int | None = None


def check_pipeline(config: Any, device_mesh: DeviceMesh, pipeline: PipelineConfig) -> list[range]:
    """Every stage's layers, once the family, the sizes and the schedule are checked (before
    any collective, so every rank says what is wrong)."""
    family = family_of(config)
    if family is None or family.pipeline is None:
        raise ValueError(
            f"TransformersModel has no pipeline layout for {model_type_of(config)!r}: pp_size "
            f"works on the {known_families(lambda f: f.pipeline is not None)} families (a "
            "family file declares pipeline=PipelineLayout(...)), or use MegatronModel"
        )
    vpp = device_mesh.vpp_size
    names = MULTI if vpp is not None else SINGLE
    if pipeline.schedule is not None and pipeline.schedule not in names:
        kind = f"vpp_size={vpp}" if vpp is not None else "one stage per rank (no vpp_size)"
        raise ValueError(
            f"pipeline schedule {pipeline.schedule!r} does not run {kind}; choose one of "
            f"{', '.join(names)}"
        )
    text = config.get_text_config()
    return stage_layers(
        [1] * text.num_hidden_layers,  # replaced by real counts in PipelinePlan.build
        device_mesh.size("pp"),
        vpp,
        split=pipeline.split,
    )


class PipelinePlan:
    """The per-call operations of a pipelined model (``ParallelPlan`` hands them on).

    Built by ``build``: this rank's chunks, the FSDP2 wrapping of each, the pipeline group
    and the groups summing a tied embedding's two copies.
    """

    def __init__(
        self,
        model: nn.Module,
        device_mesh: DeviceMesh,
        pipeline: PipelineConfig,
        device: torch.device,
        precision: str,
    ) -> None:
        self.model = model
        self.mesh = device_mesh
        self.config = pipeline
        self.device = device
        self.precision = precision
        self.pp = device_mesh.size("pp")
        self.chunks_per_rank = device_mesh.vpp_size or 1
        self.num_stages = self.pp * self.chunks_per_rank
        coords = device_mesh.coords()
        self.pp_rank = coords["pp"]
        self.is_last = self.pp_rank == self.pp - 1
        # The rank per data slice that counts the batch's tokens: the last stage scores it on
        # every tp rank, the first of them counts.
        self.reports = self.is_last and coords.get("tp", 0) == 0
        self.data_ranks = device_mesh.size("dp") * device_mesh.size("fsdp")
        self.schedule_name = pipeline.schedule or ("Interleaved1F1B" if self.multi else "1F1B")
        self.chunks: list[DecoderChunk] = []
        self.tied: nn.Parameter | None = None
        self.tied_keys: tuple[str, str] | None = None
        self.tied_group: dist.ProcessGroup | None = None
        self.tensor_parallel: TensorParallel | None = None
        self.pp_group: dist.ProcessGroup | None = None
        self._runner: tuple[Any, Any] | None = None
        self._loss: Callable[[int, torch.Tensor], torch.Tensor] | None = None
        self._targets: list[torch.Tensor] = []

    @property
    def multi(self) -> bool:
        return self.mesh.vpp_size is not None

    # ---- building ------------------------------------------------------------------------

    def build(self) -> None:
        """Prune the model to this rank's stages, split their layers over tp and shard them
        with FSDP2."""
        base = _hf_model(self.model)
        family = family_of(base.config)
        layout = family.pipeline
        decoder = base.get_decoder()
        embed = getattr(decoder, layout.embed)
        head = getattr(base, layout.head)
        tied = head.weight is embed.weight
        sizes, first, last = stage_costs(base, layout)
        stages = stage_layers(
            sizes,
            self.pp,
            self.mesh.vpp_size,
            first_extra=first,
            last_extra=last,
            split=self.config.split,
        )
        self.stages = stages
        mine = [self.pp_rank + i * self.pp for i in range(self.chunks_per_rank)]
        if tied:  # the embedding's key, then the head's (registered after it)
            named = self.model.named_parameters(remove_duplicate=False)
            embed_key, head_key = [n for n, p in named if p is embed.weight]
            self.tied_keys = (embed_key, head_key)
        self.chunks = build_chunks(base, layout, stages, mine)
        self.pp_group = self.mesh.to_torch()["pp"].get_group()
        if tied:
            self._tie(base, layout)
        if self.mesh.size("tp") > 1:  # only this stage's layers are left to split
            self.tensor_parallel = apply_tensor_parallel(self.model, self.mesh.to_torch()["tp"])
        self._shard()

    def _tie(self, base: nn.Module, layout: Any) -> None:
        """The groups pairing each first-stage rank with the last-stage rank of the same data
        and tp coordinates (the embedding is whole on every tp rank); every rank creates every
        group, as ``new_group`` requires."""
        for ranks in self.mesh.group_ranks("pp"):
            pair = [ranks[0], ranks[-1]]
            group = dist.new_group(pair)
            if dist.get_rank() in pair:
                self.tied_group = group
        if self.pp_rank == 0:
            self.tied = getattr(base.get_decoder(), layout.embed).weight
        elif self.is_last:
            self.tied = getattr(base, layout.head).weight

    def _shard(self) -> None:
        """FSDP2 over the ranks holding the same stages (and tp shards): each layer, then
        each chunk."""
        if self.data_ranks == 1:
            return
        torch_mesh = self.mesh.to_torch()
        dims = tuple(d for d in ("dp", "fsdp") if self.mesh.size(d) > 1)
        shard_mesh = torch_mesh[dims] if len(dims) > 1 else torch_mesh[dims[0]]
        policy = mixed_precision_policy(self.precision)
        for chunk in self.chunks:
            for layer in chunk.layers.values():
                fully_shard(layer, mesh=shard_mesh, mp_policy=policy)
            fully_shard(chunk, mesh=shard_mesh, mp_policy=policy)
        # FSDP2 replaced the parameters: the tied copy is the sharded one now.
        if self.tied is not None:
            base = _hf_model(self.model)
            layout = family_of(base.config).pipeline
            owner = base.get_decoder() if self.pp_rank == 0 else base
            name = layout.embed if self.pp_rank == 0 else layout.head
            self.tied = getattr(owner, name).weight

    # ---- running -------------------------------------------------------------------------

    def micro_batch_count(self, rows: int, micro_batch_size: int | None) -> int:
        """How many equal micro-batches ``rows`` are cut into (the schedule sends tensors of
        one shape per call)."""
        if micro_batch_size is not None:
            if micro_batch_size < 1 or rows % min(micro_batch_size, rows):
                raise ValueError(
                    f"micro_batch_size={micro_batch_size} must divide the {rows} rows of the "
                    f"batch under pipeline parallel (every micro-batch has one shape); pass a "
                    f"divisor of {rows}"
                )
            return rows // min(micro_batch_size, rows)
        wanted = self.config.micro_batches or self.num_stages
        return wanted if rows % wanted == 0 else rows

    def run(
        self,
        micro_batches: list[dict[str, torch.Tensor]],
        loss: Callable[[int, torch.Tensor], torch.Tensor],
        *,
        train: bool,
    ) -> None:
        """Run ``micro_batches`` through the stages; on the last stage ``loss(i, logits)`` scores
        micro-batch ``i`` (its summed loss, back-propagated when ``train``). A collective of
        the pipeline group."""
        count = len(micro_batches)
        schedule = self._schedule(count, tuple(micro_batches[0]["input_ids"].shape))
        arg_mbs = [(mb["input_ids"],) for mb in micro_batches]
        kwarg_mbs = [{"attention_mask": _mask(mb)} for mb in micro_batches]
        # Each micro-batch's target is its index; the schedule hands the same tensor back.
        self._targets = [torch.tensor(i) for i in range(count)]
        self._loss = loss
        try:
            call = schedule.step if train else schedule.eval
            extra = {"return_outputs": False} if train else {}
            call(arg_mbs=arg_mbs, kwarg_mbs=kwarg_mbs, target_mbs=self._targets, **extra)
        finally:
            self._loss, self._targets = None, []

    def _score(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        index = int(target)
        if target is not self._targets[index]:
            # A new stage infers its gradients' shapes on a copy of the first target and an
            # uninitialised output: a scalar on the output's graph, and nothing counted.
            return output.float().sum() * 0
        return self._loss(index, output)

    def _schedule(self, count: int, shape: tuple[int, ...]) -> Any:
        """The stages and schedule for ``count`` micro-batches of ``shape``: rebuilt when the
        shape changes, since a stage sizes its buffers on its first call."""
        key = (count, shape)
        if self._runner is not None and self._runner[0] == key:
            return self._runner[1]
        rounds = max(1, count // self.pp)
        if self.multi and count % rounds:
            raise ValueError(
                f"the {self.schedule_name} schedule runs the micro-batches in rounds of "
                f"pp_size={self.pp}: {count} micro-batches are not a multiple of {rounds} "
                f"rounds; pass a micro_batch_size giving a multiple of {self.pp} micro-batches"
            )
        stages = [
            PipelineStage(
                chunk,
                self.pp_rank + i * self.pp,
                self.num_stages,
                self.device,
                group=self.pp_group,
            )
            for i, chunk in enumerate(self.chunks)
        ]
        if self.multi:
            schedule = MULTI[self.schedule_name](
                stages, count, loss_fn=self._score, scale_grads=False
            )
        else:
            schedule = SINGLE[self.schedule_name](
                stages[0], count, loss_fn=self._score, scale_grads=False
            )
        self._runner = (key, schedule)
        return schedule

    # ---- what the step asks --------------------------------------------------------------

    def broadcast_result(self, loss_sum: float, tokens: float) -> tuple[float, float]:
        """The last stage's summed loss and token count, on every stage of the pipeline."""
        values = torch.tensor([loss_sum, tokens], dtype=torch.float64, device=self._comm_device())
        dist.broadcast(values, group_src=self.pp - 1, group=self.pp_group)
        return float(values[0]), float(values[1])

    def reduce_tied_gradient(self) -> None:
        """Sum the gradients of the tied embedding's two copies (first and last stage)."""
        if self.tied is None or not self.tied.requires_grad:  # both copies agree on this
            return
        if self.tied.grad is None:  # a stage whose micro-batches did not reach it
            self.tied.grad = torch.zeros_like(self.tied)
        grad = self.tied.grad
        local = grad.to_local() if isinstance(grad, DTensor) else grad
        dist.all_reduce(local, group=self.tied_group)

    def clip_grad_norm(self, params: list[nn.Parameter], max_norm: float) -> float:
        """Clip with the norm over every stage's gradients (the tied copy counted once)."""
        counted = [p for p in params if not (self.is_last and self.pp_rank and p is self.tied)]
        square = global_grad_norm(counted).float().pow(2).reshape(1).to(self._comm_device())
        dist.all_reduce(square, group=self.pp_group)
        return clip_grad_norm(params, max_norm, norm=float(square.sqrt()))

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's tensors as CPU tensors on rank 0 ({} elsewhere): each stage's
        first data rank gathers its stage and sends it to rank 0 (a collective)."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=False)
        own = get_model_state_dict(self.model, options=options)
        first = self._first_of_stage()
        whole = self._gather({k: v.detach().cpu() for k, v in own.items()} if first else {})
        if not whole:
            return {}
        if self.tied_keys is not None:  # one tensor, as the model holds it in one process
            embed, head = self.tied_keys
            whole[head] = whole[embed]
        return whole

    def adapter_tensors(self, adapter_name: str, embedding_policy: Any) -> dict[str, torch.Tensor]:
        """Adapter ``adapter_name``'s tensors of every stage, keyed as peft saves them, on rank
        0 ({} elsewhere): each stage's first data rank keys its own (a collective)."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=False)
        own = get_model_state_dict(self.model, options=options)
        part = {}
        if self._first_of_stage():
            part = get_peft_model_state_dict(
                self.model,
                state_dict=own,
                adapter_name=adapter_name,
                save_embedding_layers=embedding_policy,
            )
            part = {k: v.detach().cpu().contiguous() for k, v in part.items()}
        return self._gather(part)

    def _first_of_stage(self) -> bool:
        coords = self.mesh.coords()
        return all(coords.get(d, 0) == 0 for d in ("dp", "fsdp", "tp"))

    def _gather(self, part: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        parts = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(part, parts, dst=0)
        whole: dict[str, torch.Tensor] = {}
        for piece in parts or ():
            whole.update(piece)
        return whole

    def _comm_device(self) -> torch.device:
        return torch.device("cpu") if dist.get_backend() == "gloo" else self.device


def stage_costs(base: nn.Module, layout: Any) -> tuple[list[int], int, int]:
    """What the split balances: each decoder layer's parameter count, the embedding's (first
    stage) and the final norm's and head's (last stage). A head tied to the embedding counts
    in full too: the last stage holds a copy of it and runs its matmul, the largest of a
    small model."""
    decoder = base.get_decoder()
    sizes = [_numel(layer) for layer in getattr(decoder, layout.layers)]
    head = getattr(base, layout.head)
    norm = getattr(decoder, layout.norm)
    return sizes, _numel(getattr(decoder, layout.embed)), _numel(norm) + head.weight.numel()


def _hf_model(model: nn.Module) -> nn.Module:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _numel(module: nn.Module | None) -> int:
    return 0 if module is None else sum(p.numel() for p in module.parameters())


def _mask(micro: dict[str, torch.Tensor]) -> torch.Tensor:
    mask = micro.get("attention_mask")
    return torch.ones_like(micro["input_ids"]) if mask is None else mask
