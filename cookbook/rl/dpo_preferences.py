r"""DPO end to end on preference pairs written for the project: the reward margin grows.

    python cookbook/rl/dpo_preferences.py            # under a minute on a CPU
    python cookbook/rl/dpo_preferences.py --steps 10 # the test's run

``data/preference_pairs.jsonl`` holds 32 (prompt, chosen, rejected) rows: a correct, polite
answer against a wrong or rude one. The last 8 are held out. Each batch puts every pair on
two consecutive rows, chosen first, as DPOLoss expects. The reference is the model before
training: its summed logps of each response are computed once with ``forward_only`` and
passed as ``ref_logps`` (one number per row).

The implicit reward margin of a pair is ``beta * ((pi_c - ref_c) - (pi_r - ref_r))`` with
``pi`` the policy's summed response logps; it starts at 0 (policy = reference) and grows as
DPO trains. The bundled tiny model starts from random weights, so this shows the mechanics
(pairing, reference logps, the loss, the margin), not preference learning on a real model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from twinkle import get_logger
from twinkle.model import TransformersModel

logger = get_logger()
PAIRS = Path(__file__).parent / "data" / "preference_pairs.jsonl"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model-id", default="bundled://tiny-qwen3")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--held-out", type=int, default=8)
    return parser.parse_args(argv)


def rows_of(pairs: list[dict]) -> list[dict]:
    """Two trajectories per pair, chosen first."""
    rows = []
    for pair in pairs:
        for response in (pair["chosen"], pair["rejected"]):
            messages = [
                {"role": "user", "content": pair["prompt"]},
                {"role": "assistant", "content": response},
            ]
            rows.append({"messages": messages})
    return rows


def sequence_logps(
    model: TransformersModel, rows: list[dict], ref: list[float] | None = None
) -> list[float]:
    """Each row's summed response logps (forward_only gives 0 off the labels). Once the loss
    is DPOLoss, forward_only also scores the batch, which needs the reference's."""
    extra = {} if ref is None else {"ref_logps": ref}
    return model.forward_only(inputs=rows, **extra).logps.sum(dim=-1).tolist()


def mean_margin(policy: list[float], reference: list[float], beta: float) -> float:
    shifts = [p - r for p, r in zip(policy, reference, strict=True)]
    margins = [beta * (shifts[i] - shifts[i + 1]) for i in range(0, len(shifts), 2)]
    return sum(margins) / len(margins)


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    pairs = [json.loads(line) for line in PAIRS.read_text().splitlines() if line.strip()]
    train, held_out = rows_of(pairs[: -args.held_out]), rows_of(pairs[-args.held_out :])

    model = TransformersModel(model_id=args.model_id)
    model.set_template("Qwen3_5Template")
    # The reference: the model before any training, scored once.
    ref_train, ref_held_out = sequence_logps(model, train), sequence_logps(model, held_out)
    model.set_loss("DPOLoss", beta=args.beta)
    model.set_optimizer("AdamW", lr=args.lr)

    for step in range(args.steps):
        model.forward_backward(inputs=train, ref_logps=ref_train)
        model.clip_grad_and_step()
        if step % 10 == 0:
            margin = mean_margin(sequence_logps(model, train, ref_train), ref_train, args.beta)
            logger.info(f"step {step}: train reward margin {margin:.3f}")

    result = {
        "train_margin": mean_margin(sequence_logps(model, train, ref_train), ref_train, args.beta),
        "held_out_margin": mean_margin(
            sequence_logps(model, held_out, ref_held_out), ref_held_out, args.beta
        ),
    }
    print(
        f"reward margin: train {result['train_margin']:.3f}, "
        f"held-out {result['held_out_margin']:.3f} (0 before training)"
    )
    return result


if __name__ == "__main__":
    main()
