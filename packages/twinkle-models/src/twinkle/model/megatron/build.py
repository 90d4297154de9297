"""Build this rank's Megatron GPTModel chunk(s) with the local layer spec and load HF weights."""

from __future__ import annotations

import torch

from twinkle.model.megatron.config import GPTSpec
from twinkle.model.megatron.convert import HFWeightReader, load_hf_weights


def build_gpt_chunks(spec: GPTSpec, config, device: torch.device) -> list[torch.nn.Module]:
    """One GPTModel per virtual pipeline stage of this rank (one without vpp).

    The local layer spec (``layer_spec``) needs neither Transformer Engine nor apex; the
    same code runs on GPU, where Transformer Engine is optional.
    """
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    from twinkle.model.megatron.layer_spec import local_block_spec

    if spec.num_experts:
        _define_missing_te_gemm()
    if spec.mla:
        _mla_without_te()
        _sum_rope_key_gradient(spec)
    vpp = config.virtual_pipeline_model_parallel_size
    chunks = []
    for vp_stage in range(vpp or 1):
        stage = vp_stage if vpp else None
        chunk = GPTModel(
            config=config,
            transformer_layer_spec=local_block_spec(spec, config, stage),
            vocab_size=spec.padded_vocab_size,
            max_sequence_length=spec.max_positions,
            pre_process=parallel_state.is_pipeline_first_stage(
                ignore_virtual=False, vp_stage=stage
            ),
            post_process=parallel_state.is_pipeline_last_stage(
                ignore_virtual=False, vp_stage=stage
            ),
            share_embeddings_and_output_weights=spec.tie_embeddings,
            position_embedding_type="rope",
            rotary_base=spec.rope_theta,
            rotary_percent=spec.rotary_percent,
            vp_stage=stage,
        )
        _mark_expert_parameters(chunk, config)
        chunks.append(chunk.to(device))
    return chunks


def _mark_expert_parameters(chunk: torch.nn.Module, config) -> None:
    """NOTE: megatron-core 0.16 marks expert weights as expert-parallel (``allreduce=False``:
    their gradients are reduced over the expert data-parallel group) only when ep > 1
    (tensor_parallel/layers.py, ``expert_parallel = expert_model_parallel_size > 1``).
    With ep = 1 their gradients are reduced over the dense data-parallel group, which is
    wrong whenever the expert layout differs from the dense one: with etp > 1 it sums
    different shards of an expert, with tp > 1 and etp = 1 it leaves out the other
    tensor-parallel ranks' tokens. Marking every expert weight gives the expert
    data-parallel reduction in all layouts (the same group as the dense one otherwise)."""
    if not config.num_moe_experts:
        return
    for name, param in chunk.named_parameters():
        if ".mlp.experts." in name:
            param.allreduce = False


def _define_missing_te_gemm() -> None:
    """NOTE: megatron-core 0.16's router reads the name ``te_general_gemm`` that it defines
    only when Transformer Engine imports; without Transformer Engine (the local spec's
    case, on any device) the MoE router fails with a NameError. None is its own
    "not available" value."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def _mla_without_te() -> None:
    """NOTE: without Transformer Engine, megatron-core 0.16's transformer_engine extension
    still imports (its ``te`` a MagicMock), so multi_latent_attention sets ``HAVE_TE =
    True`` and later calls ``isinstance(linear_proj, TELinear)`` with a mock class: a
    TypeError at build time. Its flag is set from the extension's own."""
    from megatron.core.extensions import transformer_engine
    from megatron.core.transformer import multi_latent_attention

    if not transformer_engine.HAVE_TE:
        multi_latent_attention.HAVE_TE = False


class _SumTailGradient(torch.autograd.Function):
    """Identity forward; backward sums the last ``width`` features' gradient over ``group``."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, width: int, group) -> torch.Tensor:
        ctx.width, ctx.group = width, group
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        import torch.distributed as dist

        grad = grad.clone()
        tail = grad[..., -ctx.width :].contiguous()
        dist.all_reduce(tail, group=ctx.group)
        grad[..., -ctx.width :] = tail
        return grad, None, None


_ROPE_TAILS: dict[int, int] = {}
"""kv_lora_rank + rope width -> rope width, of the latent attention models built here."""


def _sum_rope_key_gradient(spec: GPTSpec) -> None:
    """NOTE: megatron-core 0.16's local MLA splits ``linear_kv_down_proj``'s output over tp
    and gathers it back (``gather_from_tensor_model_parallel_region``). The gather's
    backward keeps each rank's own columns, but the rope key (the last
    ``qk_pos_emb_head_dim`` columns) is shared by every head, and each rank's gradient of
    it holds its own heads' part only: the other ranks' parts are lost (gradient norms 3e-5
    off at tp2). The gather, as that module calls it, sums the rope key's gradient over
    tp first. The query's latent, gathered the same way, goes to this rank's heads only and
    is told apart by its width."""
    from megatron.core import parallel_state
    from megatron.core.transformer import multi_latent_attention

    width = spec.mla["kv_lora_rank"] + spec.mla["qk_pos_emb_head_dim"]
    tp = parallel_state.get_tensor_model_parallel_world_size()
    if spec.mla["q_lora_rank"] == width and tp > 1:
        raise ValueError(
            f"tp_size={tp} with q_lora_rank = kv_lora_rank + qk_rope_head_dim = {width}: "
            "MegatronModel tells the two latents apart by width under tensor parallel; use "
            "tp_size=1 for this model"
        )
    _ROPE_TAILS[width] = spec.mla["qk_pos_emb_head_dim"]
    gather = multi_latent_attention.gather_from_tensor_model_parallel_region
    if getattr(gather, "sums_rope_key", False):
        return

    def gather_summing_the_rope_key(tensor: torch.Tensor) -> torch.Tensor:
        gathered = gather(tensor)
        tail = _ROPE_TAILS.get(gathered.shape[-1])
        if tail is None or parallel_state.get_tensor_model_parallel_world_size() == 1:
            return gathered
        return _SumTailGradient.apply(
            gathered, tail, parallel_state.get_tensor_model_parallel_group()
        )

    gather_summing_the_rope_key.sums_rope_key = True
    multi_latent_attention.gather_from_tensor_model_parallel_region = gather_summing_the_rope_key


def load_weights(chunks: list[torch.nn.Module], spec: GPTSpec, reader: HFWeightReader) -> None:
    """Fill every chunk from Hugging Face weights, this rank's tensor-parallel shard only."""
    from megatron.core import parallel_state

    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    tp = parallel_state.get_tensor_model_parallel_world_size()
    for chunk in chunks:
        load_hf_weights(chunk, spec, reader, tp_rank, tp)


def wrap_ddp(chunks: list[torch.nn.Module], config, use_distributed_optimizer: bool) -> list:
    """Megatron's DDP around each chunk: fp32 gradient buffers its optimizer steps from.

    Gradients are reduced once per step (``finalize_model_grads``), not overlapped with
    backward, so accumulation over several ``forward_backward`` calls needs no no-sync
    context.
    """
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=False,
        use_distributed_optimizer=use_distributed_optimizer,
    )
    return [
        DistributedDataParallel(
            config=config, ddp_config=ddp_config, module=chunk, disable_bucketing=index > 0
        )
        for index, chunk in enumerate(chunks)
    ]
