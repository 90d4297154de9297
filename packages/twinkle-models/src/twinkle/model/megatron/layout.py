"""How a twinkle DeviceMesh maps onto Megatron's parallel state, and why some meshes cannot.

Megatron numbers ranks with tensor parallel fastest, then context parallel, then
data parallel, then pipeline stages (its order ``tp-cp-ep-dp-pp``). A twinkle
DeviceMesh numbers them ``pp > dp > fsdp > cp > tp`` (tp fastest), so the two
agree rank for rank once dp × fsdp is read as Megatron's data-parallel size:
the data slice a rank receives from the DataLoader is the one Megatron's
data-parallel rank expects. Ulysses sequence parallel has no Megatron
counterpart (Megatron uses context parallel) and is refused.

Checks against the model (heads, layers, experts) live here too, so an
impossible combination fails when the MegatronModel is built, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from twinkle.mesh import DeviceMesh


@dataclass(frozen=True)
class MegatronLayout:
    """Megatron's parallel sizes for one model; ``dp`` is the mesh's dp × fsdp."""

    tp: int = 1
    pp: int = 1
    vpp: int | None = None
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    dp: int = 1
    sequence_parallel: bool = False

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def expert_tp(self) -> int:
        """Expert tensor parallel: etp_size when given, else tp (Megatron's default)."""
        return self.etp if self.etp is not None else self.tp

    @classmethod
    def from_mesh(cls, mesh: DeviceMesh | None) -> MegatronLayout:
        if mesh is None:
            return cls()
        if mesh.ulysses_size not in (None, 1):
            raise ValueError(
                "MegatronModel has no Ulysses sequence parallel: use cp_size (context "
                "parallel) for long sequences, or TransformersModel for ulysses_size"
            )
        if mesh.ep_fsdp_size not in (None, 1):
            raise ValueError(
                "MegatronModel shards experts with ep_size and etp_size; ep_fsdp_size is "
                "TransformersModel's expert FSDP and has no Megatron counterpart"
            )
        return cls(
            tp=mesh.size("tp"),
            pp=mesh.size("pp"),
            vpp=mesh.vpp_size,
            cp=mesh.size("cp"),
            ep=mesh.size("ep"),
            etp=mesh.etp_size,
            dp=mesh.size("dp") * mesh.size("fsdp"),
            sequence_parallel=mesh.sequence_parallel,
        )

    def check_model(self, hf_config) -> None:
        """Refuse sizes the model cannot be split by, saying which number fails and why."""
        heads = hf_config.num_attention_heads
        kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
        layers = hf_config.num_hidden_layers
        if heads % self.tp:
            raise ValueError(
                f"tp_size={self.tp} does not divide the model's {heads} attention heads: each "
                f"tensor-parallel rank holds whole heads; pick a tp_size dividing {heads}"
            )
        if kv_heads % self.tp:
            raise ValueError(
                f"tp_size={self.tp} does not divide the model's {kv_heads} key/value heads "
                f"(grouped-query attention): pick a tp_size dividing {kv_heads}"
            )
        stages = self.pp * (self.vpp or 1)
        if stages > layers:
            raise ValueError(
                f"pp_size={self.pp} (× vpp_size={self.vpp or 1}) = {stages} pipeline stages "
                f"but the model has only {layers} layers: each stage needs at least one"
            )
        if layers % stages:
            raise ValueError(
                f"{layers} layers do not split evenly into pp_size × vpp_size = {stages} "
                f"stages; pick sizes whose product divides {layers}"
            )
        experts = getattr(hf_config, "num_experts", None) or getattr(
            hf_config, "num_local_experts", None
        )
        if self.ep > 1 and not experts:
            raise ValueError(
                f"ep_size={self.ep} (expert parallel) needs a mixture-of-experts model; "
                f"{hf_config.model_type} is dense: drop ep_size"
            )
        if experts and experts % self.ep:
            raise ValueError(f"ep_size={self.ep} does not divide the model's {experts} experts")
        self._check_experts(hf_config, experts)

    def _check_experts(self, hf_config, experts: int | None) -> None:
        if not experts:
            if self.etp not in (None, 1):
                raise ValueError(f"etp_size={self.etp} needs a mixture-of-experts model: drop it")
            return
        if self.tp > 1 and not self.sequence_parallel:
            raise ValueError(
                f"tp_size={self.tp} with a mixture-of-experts model: Megatron requires sequence "
                "parallel then; pass sequence_parallel=True to the DeviceMesh"
            )
        width = hf_config.moe_intermediate_size
        if width % self.expert_tp:
            raise ValueError(
                f"etp_size={self.expert_tp} does not divide the experts' width {width}: each "
                "expert-tensor-parallel rank holds an equal slice; pick a divisor"
            )


def initialize_parallel_state(layout: MegatronLayout, seed: int, backend: str) -> None:
    """Build Megatron's process groups (once per process) and its model-parallel RNG seeds.

    torch.distributed starts on ``backend`` (nccl, hccl, or gloo for the CPU) from the
    launcher's environment (torchrun) when nobody started it; a plain single process gets a
    private one-rank group, which Megatron needs even then.
    """
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel

    if not dist.is_initialized():
        _init_process_group(backend)
    world = dist.get_world_size()
    if world != layout.world_size:
        raise ValueError(
            f"the device mesh covers {layout.world_size} ranks (tp {layout.tp} × pp "
            f"{layout.pp} × cp {layout.cp} × dp {layout.dp}) but {world} processes run; "
            "launch as many processes as the mesh has ranks"
        )
    if parallel_state.model_parallel_is_initialized():
        current = (
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size(),
            parallel_state.get_context_parallel_world_size(),
            parallel_state.get_expert_model_parallel_world_size(),
        )
        wanted = (layout.tp, layout.pp, layout.cp, layout.ep)
        if current != wanted:
            raise ValueError(
                f"Megatron's parallel state already holds (tp, pp, cp, ep) = {current} in this "
                f"process; a second MegatronModel with {wanted} cannot share it"
            )
    else:
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=layout.tp,
            pipeline_model_parallel_size=layout.pp,
            virtual_pipeline_model_parallel_size=layout.vpp,
            context_parallel_size=layout.cp,
            expert_model_parallel_size=layout.ep,
            expert_tensor_parallel_size=layout.expert_tp,
        )
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def _init_process_group(backend: str) -> None:
    import os
    import socket

    import torch.distributed as dist

    if "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend)
        return
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
