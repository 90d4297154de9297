"""Per-token log-probabilities from vocabulary-parallel logits, without gathering the vocabulary.

Each tensor-parallel rank holds the logits of a slice of the (padded) vocabulary.
``log p(y) = z_y - m - log sum_v exp(z_v - m)`` needs three numbers per token from
across the slices: the max ``m``, the sum of exponentials, and the target logit
``z_y`` (held by one slice). They are all-reduced (the sum and target with
Megatron's autograd-aware reduce, whose backward is the identity, correct here
because every rank computes the same loss from them). Padding rows of the
vocabulary are masked to -inf, so they never take probability mass.

Alignment follows twinkle's convention: ``labels`` are not shifted, logits at
t - 1 predict ``labels[:, t]``, and ``logps[:, t]`` is 0 off the labels and at t = 0.
"""

from __future__ import annotations

import torch

from twinkle.loss.base import IGNORE_INDEX


def vocab_parallel_logps(
    logits: torch.Tensor, labels: torch.Tensor, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logps, predicted_ids)``, both (B, T) aligned with ``labels``, from (B, T, V/tp) logits.

    ``predicted_ids`` is the argmax of the logits predicting each position (IGNORE_INDEX
    off the labels), so ``predicted_ids == labels`` is next-token accuracy.
    """
    token_logps, candidate = next_token_logps(logits[:, :-1], labels[:, 1:], vocab_size)
    return align_with_labels(token_logps, candidate, labels)


def align_with_labels(
    token_logps: torch.Tensor, predicted: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T - 1) results of the logits at t - 1 -> (B, T) aligned with ``labels[:, t]``."""
    logps = torch.zeros(labels.shape, dtype=token_logps.dtype, device=labels.device)
    logps[:, 1:] = token_logps
    aligned = torch.full_like(labels, IGNORE_INDEX)
    aligned[:, 1:] = predicted
    return logps, aligned


def next_token_logps(
    logits: torch.Tensor, targets: torch.Tensor, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``log p(targets)`` and the argmax at each position of (B, S, V/tp) logits, with no
    shift (``targets[:, s]`` is what ``logits[:, s]`` predicts); 0 and IGNORE_INDEX where
    the target is IGNORE_INDEX."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import reduce_from_tensor_model_parallel_region

    group = parallel_state.get_tensor_model_parallel_group()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    local = logits.float()
    mask = targets != IGNORE_INDEX
    width = local.shape[-1]
    start = tp_rank * width
    columns = torch.arange(start, start + width, device=local.device)
    local = local.masked_fill(columns >= vocab_size, float("-inf"))

    local_max, local_arg = local.detach().max(dim=-1)
    global_max = local_max.clone()
    dist.all_reduce(global_max, op=dist.ReduceOp.MAX, group=group)
    sum_exp = reduce_from_tensor_model_parallel_region(
        torch.exp(local - global_max.unsqueeze(-1)).sum(dim=-1)
    )
    in_slice = mask & (targets >= start) & (targets < start + width)
    index = torch.where(in_slice, targets - start, 0).unsqueeze(-1)
    target_logit = torch.where(in_slice, local.gather(-1, index).squeeze(-1), 0.0)
    target_logit = reduce_from_tensor_model_parallel_region(target_logit)
    token_logps = target_logit - global_max - torch.log(sum_exp)

    # Argmax across slices: the slice holding the global max reports its index; ties go to
    # the lowest vocabulary id, as torch.argmax does.
    candidate = torch.where(local_max == global_max, local_arg + start, torch.iinfo(torch.long).max)
    dist.all_reduce(candidate, op=dist.ReduceOp.MIN, group=group)
    return torch.where(mask, token_logps, 0.0), torch.where(mask, candidate, IGNORE_INDEX)
