"""Communication volume per optimizer step, FSDP2 vs DDP vs tensor parallel, against the
theoretical values.

    python benchmarks/bench_parallel_comm.py            # launches itself under torchrun (2 ranks)

A ~50M-parameter Qwen3 (random init, float32) trains full-parameter on 2 CPU ranks (gloo)
through ``twinkle.model.transformers.strategy.parallelize``. Bytes are counted by hooks:
FSDP2's collectives (``all_gather_single``, ``reduce_scatter_single``, ``all_reduce``)
are wrapped at ``torch.distributed``, and DDP's bucket all-reduces by a DDP comm hook.
Each collective's payload is turned into the bytes one rank sends with the ring
algorithm: all-reduce 2(n-1)/n of its buffer, all-gather and reduce-scatter (n-1)/n of
the full tensor. Theory, with P parameters of b bytes: DDP 2(n-1)/n·P·b (one all-reduce
of every gradient); FSDP2 3(n-1)/n·P·b (all-gather in forward, again in backward,
reduce-scatter of the gradients). The root module (embeddings, head, final norm) keeps
its parameters gathered from forward to backward, so FSDP2 measures below 3(n-1)/n by
the root's share of one all-gather.

Tensor parallel (``tp``: every rank runs the same batch, DTensor's functional collectives
counted at ``torch.distributed._functional_collectives``): activations, not weights, travel.
With A = rows × sequence × hidden × b bytes, each layer all-reduces A twice in forward
(after o_proj and down_proj) and, with torch's one module per projection, five times in
backward (the input gradients of q, k, v and of gate, up; Megatron's fused qkv and gate/up
need two), plus the q/k norm gradients: theory 7·L·2(n-1)/n·A, Megatron's 4·L·2(n-1)/n·A.
``megatron_tp`` measures MegatronModel on the same model and batch: (4·L + 2)·2(n-1)/n·A,
the 2 for the vocabulary-parallel embedding's output and the head's input gradient (the
vocabulary-parallel logps add a few (T,) float reductions).

Tensor parallel on the other families and with data parallel (``tp:<bundled model>`` on 2
ranks, ``dp2xtp2`` on 4; the bundled tiny configs, random init, 2 rows × 128 tokens a tp
group). The theory is read off the family's plan (``twinkle.model.families``) and the
unsplit model, module by module, with T = rows × sequence tokens and b bytes: a colwise
linear all-reduces its input's gradient in backward (T·in_features·b), a rowwise one its
output in forward (T·out_features·b), a ``HeadSharedTail`` the gradient of its shared
tail (T·width·b), a ``replicated_with_grad_allreduce`` module its weights' gradient once
a step; each all-reduce sends 2(n-1)/n of it. Under dp × tp every rank then averages its
local gradients over dp once a step: 2(d-1)/d · (P_split/t + P_whole) · b. Counted at
``torch.distributed.all_reduce`` and DTensor's functional all-reduce, each with its own
group's size.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from provenance import commit  # noqa: E402
from torchrun_launch import table_rows  # noqa: E402

CONFIG = dict(
    vocab_size=32000,
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=10,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=64,
    tie_word_embeddings=True,
)
ROWS_PER_RANK, SEQ_LEN = 2, 128
FAMILY_STRATEGIES = (
    "tp:tiny-qwen3",
    "tp:tiny-qwen3-moe",
    "tp:tiny-qwen3.5",
    "tp:tiny-deepseek-v3",
    "tp:tiny-glm4.5",
    "dp2xtp2",
)
# The torch.distributed functions FSDP2 calls, and which argument is the full tensor.
FSDP_COLLECTIVES = (("all_gather_single", 0), ("reduce_scatter_single", 1), ("all_reduce", 0))
COUNTS: Counter = Counter()
CALLS: Counter = Counter()


def ring_bytes(op: str, tensor: torch.Tensor, world: int) -> float:
    size = tensor.numel() * tensor.element_size()
    factor = {"all_reduce": 2 * (world - 1) / world}.get(op, (world - 1) / world)
    return factor * size


def count_fsdp_collectives(world: int) -> None:
    """Wrap the torch.distributed functions FSDP2 calls (it looks them up on the module)."""
    for op, tensor_arg in (
        ("all_gather_single", 0),
        ("reduce_scatter_single", 1),
        ("all_reduce", 0),
    ):
        original = getattr(dist, op)

        def counted(*args, _op=op, _original=original, _index=tensor_arg, **kwargs):
            full = args[_index] if len(args) > _index else kwargs.get("input", kwargs.get("tensor"))
            kind = "all_reduce" if _op == "all_reduce" else _op
            COUNTS[kind] += ring_bytes(kind, full, world)
            CALLS[kind] += 1
            return _original(*args, **kwargs)

        setattr(dist, op, counted)


def count_tensor_parallel_collectives(world: int) -> None:
    """Wrap the functional collectives DTensor redistributes with, and ``dist.all_reduce``
    (the q/k norm gradients)."""
    import torch.distributed._functional_collectives as funcol

    for module, op in ((funcol, "all_reduce"), (dist, "all_reduce")):
        original = getattr(module, op)

        def counted(tensor, *args, _original=original, **kwargs):
            COUNTS["all_reduce"] += ring_bytes("all_reduce", tensor, world)
            CALLS["all_reduce"] += 1
            return _original(tensor, *args, **kwargs)

        setattr(module, op, counted)


def count_all_reduces_by_group() -> None:
    """Wrap the functional all-reduce (DTensor's, over the tp group) and
    ``dist.all_reduce`` (q/k norm and shared-tail gradients, dp averaging), each counted
    with the size of the group it runs on."""
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.distributed_c10d import _resolve_process_group

    def size_of(group) -> int:
        if group is None:
            return dist.get_world_size()
        # NOTE: private torch helpers: the group a functional collective names (a mesh, a
        # (mesh, dim) pair, a rank list or a group name) as its process group.
        name = funcol._resolve_group_name(group)
        return dist.get_world_size(_resolve_process_group(name))

    original_funcol = funcol.all_reduce

    def functional(tensor, *args, **kwargs):
        group = kwargs.get("group", args[1] if len(args) > 1 else None)
        COUNTS["all_reduce"] += ring_bytes("all_reduce", tensor, size_of(group))
        CALLS["all_reduce"] += 1
        return original_funcol(tensor, *args, **kwargs)

    original_dist = dist.all_reduce

    def eager(tensor, *args, **kwargs):
        group = kwargs.get("group", args[1] if len(args) > 1 else None)
        COUNTS["all_reduce"] += ring_bytes("all_reduce", tensor, size_of(group))
        CALLS["all_reduce"] += 1
        return original_dist(tensor, *args, **kwargs)

    funcol.all_reduce = functional
    dist.all_reduce = eager


def count_exchanges_by_group() -> None:
    """Wrap ``dist.all_to_all_single`` (Ulysses' head/sequence swaps, EP's token dispatch)
    and ``dist.all_gather`` (the gathered logps), each counted with its group's size: an
    all-to-all sends (n-1)/n of its input, an all-gather (n-1)/n of its output."""
    original_a2a, original_gather = dist.all_to_all_single, dist.all_gather

    def exchange(output, input, *args, **kwargs):
        size = dist.get_world_size(kwargs.get("group"))
        splits = kwargs.get("input_split_sizes", args[1] if len(args) > 1 else None)
        if splits:  # uneven: what leaves this rank is every chunk but its own
            rank = dist.get_rank(kwargs.get("group"))
            row = input.numel() // max(input.shape[0], 1) * input.element_size()
            sent = (sum(splits) - splits[rank]) * row
        else:
            sent = (size - 1) / size * input.numel() * input.element_size()
        COUNTS["all_to_all"] += sent
        CALLS["all_to_all"] += 1
        return original_a2a(output, input, *args, **kwargs)

    def gather(tensors, tensor, *args, **kwargs):
        size = dist.get_world_size(kwargs.get("group"))
        COUNTS["all_gather"] += (size - 1) * tensor.numel() * tensor.element_size()
        CALLS["all_gather"] += 1
        return original_gather(tensors, tensor, *args, **kwargs)

    dist.all_to_all_single, dist.all_gather = exchange, gather


def plan_theory(model, config, tokens: int, tp: int, dp: int) -> float:
    """Bytes one rank sends a step by the family's tensor-parallel plan (module docstring),
    read off the unsplit model."""
    from fnmatch import fnmatch

    from twinkle.model.families import family_of
    from twinkle.model.families.base import HeadSharedTail

    styles = family_of(config).tp_plan.styles
    text = config.get_text_config()
    b, ring = 4, 2 * (tp - 1) / tp
    activations = norms = 0.0
    split = whole = 0
    seen: set[int] = set()  # a tied head is the embedding's weight: counted once
    for name, module in model.named_modules():
        style = next((st for pat, st in styles.items() if fnmatch(name, f"*{pat}")), None)
        mine = [p for p in module.parameters(recurse=False) if id(p) not in seen]
        seen.update(id(p) for p in mine)
        own = sum(p.numel() for p in mine)
        if style == "colwise":
            activations += tokens * module.in_features * b
            split += own
        elif style == "rowwise":
            activations += tokens * module.out_features * b
            split += own
        elif isinstance(style, HeadSharedTail):
            activations += tokens * getattr(text, style.attribute) * b
        elif style == "replicated_with_grad_allreduce":
            norms += sum(p.numel() for p in module.parameters()) * b
        if style not in ("colwise", "rowwise"):
            whole += own
    data = 2 * (dp - 1) / dp * (split / tp + whole) * b if dp > 1 else 0.0
    return ring * (activations + norms) + data


def family_child(strategy: str, steps: int) -> None:
    """``tp:<bundled name>`` (tp over every rank) or ``dp2xtp2`` (the bundled tiny Qwen3)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from twinkle import DeviceMesh
    from twinkle.hub import resolve_model
    from twinkle.model.transformers.strategy import parallelize

    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    name = strategy.split(":", 1)[1] if strategy.startswith("tp:") else "tiny-qwen3"
    dp = 2 if strategy == "dp2xtp2" else 1
    tp = world // dp
    mesh = DeviceMesh.from_sizes(dp_size=dp, tp_size=tp, device_type="cpu")
    config = AutoConfig.from_pretrained(resolve_model(f"bundled://{name}"))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    theory = plan_theory(model, config, ROWS_PER_RANK * SEQ_LEN, tp, dp)
    plan = parallelize(model, mesh)
    count_all_reduces_by_group()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(rank // tp)  # one batch per tp group
    batch = torch.randint(0, config.vocab_size, (ROWS_PER_RANK, SEQ_LEN), generator=generator)
    per_step, seconds = [], []
    for _ in range(steps + 1):  # the first step warms up and is not counted
        COUNTS.clear()
        CALLS.clear()
        start = time.perf_counter()
        loss = plan.run("bench", lambda ids: model(input_ids=ids, labels=ids).loss, batch)
        loss.backward()
        plan.reduce_extra_gradients()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - start)
        per_step.append((dict(COUNTS), dict(CALLS)))
    counts, calls = per_step[-1]
    assert all(c == counts for c, _ in per_step[1:]), "the volume changed between steps"
    if rank == 0:
        measured = sum(counts.values())
        label = f"dp2 × tp{tp}" if dp > 1 else f"tp{tp} {name}"
        print(
            f"| {label} | {measured / 2**20:.3f} | {theory / 2**20:.3f} | "
            f"{measured / theory:.3f} | all_reduce {calls.get('all_reduce', 0)}× | "
            f"{1e3 * statistics.median(seconds[1:]):.0f} |",
            flush=True,
        )
    dist.barrier()
    dist.destroy_process_group()


COMBINED = {
    # Ulysses under tp=2 splits each rank's 2 key/value heads over 2 ranks: 4 kv heads.
    "dp2xtp2xulysses2": ({"dp_size": 2, "tp_size": 2, "ulysses_size": 2}, "tiny-qwen3"),
    "dp2xtp2xep2": ({"dp_size": 2, "tp_size": 2, "ep_size": 2}, "tiny-qwen3-moe"),
}


def model_child(strategy: str, steps: int) -> None:
    """A combined layout through TransformersModel itself (its batch split, Ulysses, EP and
    its gradient reductions), 4 rows × 128 tokens a step over the data ranks."""
    from transformers import AutoConfig

    from twinkle import DeviceMesh
    from twinkle.hub import resolve_model
    from twinkle.model import TransformersModel

    dist.init_process_group("gloo")
    sizes, name = COMBINED[strategy]
    mesh = DeviceMesh.from_sizes(**sizes, device_type="cpu")
    config = AutoConfig.from_pretrained(resolve_model(f"bundled://{name}"))
    if "ulysses_size" in sizes:
        config.num_key_value_heads = 4
    model = TransformersModel(config=config, device_mesh=mesh, device="cpu", seed=0)
    model.set_optimizer("AdamW", lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    rows = torch.randint(0, config.vocab_size, (4, SEQ_LEN), generator=generator).tolist()
    feats = [{"input_ids": r, "labels": r} for r in rows]
    mine = feats[mesh.get_slice(len(feats))]
    count_all_reduces_by_group()
    count_exchanges_by_group()
    per_step, seconds = [], []
    for _ in range(steps + 1):
        COUNTS.clear()
        CALLS.clear()
        start = time.perf_counter()
        model.forward_backward(mine)
        model.clip_grad_and_step(1.0)
        seconds.append(time.perf_counter() - start)
        per_step.append((dict(COUNTS), dict(CALLS)))
    counts, calls = per_step[-1]
    if "ep_size" in sizes:  # the router's choices move with the weights: the counted steps' mean
        counts = {op: statistics.mean(c.get(op, 0.0) for c, _ in per_step[1:]) for op in counts}
    else:
        assert all(c == counts for c, _ in per_step[1:]), "the volume changed between steps"
    if dist.get_rank() == 0:
        theory = combined_theory(config, sizes, len(feats))
        measured = sum(counts.values())
        detail = ", ".join(f"{op} {calls[op]}× {counts[op] / 2**20:.3f}" for op in sorted(counts))
        print(
            f"| {strategy} {name} | {measured / 2**20:.3f} | {theory / 2**20:.3f} | "
            f"{measured / theory:.3f} | {detail} | {1e3 * statistics.median(seconds[1:]):.0f} |",
            flush=True,
        )
    dist.barrier()
    dist.destroy_process_group()


def combined_theory(config, sizes: dict, rows: int) -> float:
    """Bytes one rank sends a step in a COMBINED layout, from the config alone.

    Ulysses (u ranks, carved from dp: every rank holds all rows, T = rows × S/u tokens):
    the plan's tp all-reduces and the dp averaging of ``plan_theory`` on T tokens, plus per
    attention layer eight all-to-alls (q, k, v and the output, forward and backward) of
    (u-1)/u · T · d · b · (heads or kv heads)/t each, plus the gathered label logps (float32)
    and ids (int64): (u-1) · T · 12 bytes. Expert parallel (ep carved from dp, rows/dp per
    data rank, T = rows/dp × S): ``plan_theory`` without the experts (sharded over ep, each
    on one rank of the dp group: nothing to average), plus per MoE layer four token
    all-to-alls (dispatch and return, forward and backward) of T · k · H · b · (ep-1)/ep if
    the router spread the tokens evenly (the figure that depends on the batch), and one
    exchange of the (ep × E/ep) int64 token counts."""
    from transformers import AutoModelForCausalLM

    tp, dp, b = sizes["tp_size"], sizes["dp_size"], 4
    model = AutoModelForCausalLM.from_config(config)
    text = config.get_text_config()
    if "ulysses_size" in sizes:
        u = sizes["ulysses_size"]
        tokens = rows * SEQ_LEN // u
        heads = 2 * (text.num_attention_heads + text.num_key_value_heads) // tp
        exchanges = 2 * text.num_hidden_layers * (u - 1) / u * tokens * text.head_dim * heads * b
        return plan_theory(model, config, tokens, tp, dp) + exchanges + (u - 1) * tokens * 12
    ep = sizes["ep_size"]
    tokens = rows // dp * SEQ_LEN
    for name, module in model.named_modules():  # the experts' gradients stay on their rank
        if name.endswith("mlp.experts"):
            for param in module.parameters():
                param.data = param.data.new_empty(0)
    experts = text.num_experts or text.num_local_experts
    k, layers = text.num_experts_per_tok, text.num_hidden_layers
    dispatch = layers * 4 * tokens * k * text.hidden_size * b * (ep - 1) / ep
    counts = layers * (ep - 1) / ep * experts * 8
    return plan_theory(model, config, tokens, tp, dp) + dispatch + counts


def count_ddp_buckets(wrapper, world: int) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    def hook(group, bucket):
        COUNTS["all_reduce"] += ring_bytes("all_reduce", bucket.buffer(), world)
        CALLS["all_reduce"] += 1
        return default_hooks.allreduce_hook(group, bucket)

    wrapper.register_comm_hook(None, hook)


def child(strategy: str, steps: int) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from twinkle import DeviceMesh
    from twinkle.model.transformers.strategy import parallelize

    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    sizes = {"fsdp2": {"fsdp_size": world}, "tp": {"tp_size": world}}.get(
        strategy, {"dp_size": world}
    )
    mesh = DeviceMesh.from_sizes(**sizes, device_type="cpu")
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**CONFIG))
    params = sum(p.numel() for p in model.parameters())
    plan = parallelize(model, mesh)
    if strategy == "ddp":
        count_ddp_buckets(plan.root("bench"), world)
    elif strategy == "tp":
        count_tensor_parallel_collectives(world)
    else:
        count_fsdp_collectives(world)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0 if strategy == "tp" else rank)
    batch = torch.randint(0, CONFIG["vocab_size"], (ROWS_PER_RANK, SEQ_LEN), generator=generator)
    per_step, seconds = [], []
    for _ in range(steps + 1):  # the first step warms up and is not counted
        COUNTS.clear()
        CALLS.clear()
        start = time.perf_counter()
        loss = plan.run("bench", lambda ids: model(input_ids=ids, labels=ids).loss, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - start)
        per_step.append((dict(COUNTS), dict(CALLS)))
    counts, calls = per_step[-1]
    assert all(c == counts for c, _ in per_step[1:]), "the volume changed between steps"
    if rank == 0:
        if strategy == "tp":  # activations: 7 all-reduces a layer (module docstring)
            activation = ROWS_PER_RANK * SEQ_LEN * CONFIG["hidden_size"] * 4
            layers = CONFIG["num_hidden_layers"]
            theory = 7 * layers * 2 * (world - 1) / world * activation
            print(f"tp: Megatron's fused layout would send {4 / 7 * theory / 2**20:.1f} MiB")
        else:
            theory = {"ddp": 2, "fsdp2": 3}[strategy] * (world - 1) / world * params * 4
        measured = sum(counts.values())
        detail = ", ".join(f"{op} {calls[op]}× {counts[op] / 2**20:.1f}" for op in sorted(counts))
        print(
            f"| {strategy} | {params / 1e6:.1f}M | {measured / 2**20:.1f} | {theory / 2**20:.1f} "
            f"| {measured / theory:.3f} | {detail} | "
            f"{1e3 * statistics.median(seconds[1:]):.0f} |",
            flush=True,
        )
    dist.barrier()
    dist.destroy_process_group()


def megatron_child(steps: int) -> None:
    """MegatronModel at tp2 on the same 48M model and batch as ``tp``, counted at
    ``torch.distributed`` (megatron-core's tensor-parallel regions call it)."""
    from transformers import Qwen3Config

    from twinkle import DeviceMesh
    from twinkle.model import MegatronModel

    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    mesh = DeviceMesh.from_sizes(tp_size=world, device_type="cpu")
    model = MegatronModel(config=Qwen3Config(**CONFIG), device_mesh=mesh, device="cpu")
    model.set_optimizer("AdamW", lr=1e-4)
    count_all_reduces_by_group()
    count_exchanges_by_group()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, CONFIG["vocab_size"], (ROWS_PER_RANK, SEQ_LEN), generator=generator)
    batch = {"input_ids": ids, "labels": ids, "attention_mask": torch.ones_like(ids)}
    per_step, seconds = [], []
    for _ in range(steps + 1):  # the first step warms up and is not counted
        COUNTS.clear()
        CALLS.clear()
        start = time.perf_counter()
        model.forward_backward(batch)
        model.clip_grad_and_step(1.0)
        seconds.append(time.perf_counter() - start)
        per_step.append((dict(COUNTS), dict(CALLS)))
    counts, calls = per_step[-1]
    if rank == 0:
        # 4 all-reduces of A a layer (after linear_proj and linear_fc2 in forward; the input
        # gradients of the fused linear_qkv and linear_fc1 in backward), and 2 more of A for
        # the vocabulary-parallel embedding (forward) and head (its input's gradient).
        activation = ROWS_PER_RANK * SEQ_LEN * CONFIG["hidden_size"] * 4
        layers = CONFIG["num_hidden_layers"]
        theory = (4 * layers + 2) * 2 * (world - 1) / world * activation
        measured = sum(counts.values())
        detail = ", ".join(f"{op} {calls[op]}× {counts[op] / 2**20:.3f}" for op in sorted(counts))
        params = sum(p.numel() for chunk in model.chunks for p in chunk.parameters()) * world
        print(
            f"| megatron tp | {params / 1e6:.1f}M (sum of shards) | {measured / 2**20:.1f} | "
            f"{theory / 2**20:.1f} | {measured / theory:.3f} | {detail} | "
            f"{1e3 * statistics.median(seconds[1:]):.0f} |",
            flush=True,
        )
    dist.barrier()
    os._exit(0)  # NOTE: gloo's teardown can abort a rank whose peer closed first


def launch(strategy: str, steps: int, ranks: int) -> str:
    return table_rows(__file__, ranks, "--child", strategy, "--steps", str(steps))[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=3, help="counted steps per strategy")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.child == "megatron_tp":
            megatron_child(args.steps)
        elif args.child.startswith("tp:") or args.child == "dp2xtp2":
            family_child(args.child, args.steps)
        elif args.child in COMBINED:
            model_child(args.child, args.steps)
        else:
            child(args.child, args.steps)
        return
    print(
        f"{datetime.date.today()} · {platform.machine()}, {os.cpu_count()} CPUs · gloo, "
        f"{args.ranks} ranks · torch {torch.__version__} · commit {commit()}\n"
    )
    print("Bytes one rank sends per optimizer step (MiB, ring algorithm), full training\n")
    print("| strategy | params | measured | theoretical | ratio | per collective (MiB) | ms/step |")
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: |")
    for strategy in ("ddp", "fsdp2", "tp", "megatron_tp"):
        print(launch(strategy, args.steps, args.ranks))
    print("\nTensor parallel by family and with dp (bundled tiny configs, 2 rows × 128 tokens")
    print("a tp group; MiB one rank sends a step; theory from the family's plan)\n")
    print("| layout | measured | theoretical | ratio | collectives | ms/step |")
    print("| --- | ---: | ---: | ---: | --- | ---: |")
    for strategy in FAMILY_STRATEGIES:
        print(launch(strategy, args.steps, 4 if strategy == "dp2xtp2" else 2))
    for strategy in COMBINED:
        print(launch(strategy, args.steps, 4))


if __name__ == "__main__":
    main()
