"""One CPU process: MegatronModel takes ``old_logps`` in the shapes the documents pass them.

Usage: python megatron_rl_inputs.py OUT_DIR. Writes ``OUT_DIR/rl_inputs.json``: the GRPO
loss of one batch, in micro-batches of 2 as the Ray GRPO sample runs it, with the old logps
as a (B, T) tensor, as per-row floats (``[lp[0][1] for lp in sequence.logprobs]``) and as
the sampler's per-token ``(token_id, logprob)`` lists (``seq.get('logprobs', [])``); and the
error for a row one value short. A separate process, as Megatron's parallel state is global.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from twinkle.model import MegatronModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from megatron_parallel import MODEL, features  # noqa: E402


def main() -> None:
    out_dir = Path(sys.argv[1])
    feats = features()
    model = MegatronModel(MODEL, device="cpu")
    model.set_optimizer("default", lr=1e-3)
    aligned = model.forward_only(feats).logps  # (B, T), 0 off the labels
    model.set_loss("GRPOLoss", epsilon=0.2)
    # What a sampler returns for each row's completion: the label tokens' values only.
    floats, pairs = [], []
    for row, feature in enumerate(feats):
        label = torch.as_tensor(feature["labels"])
        positions = (label != -100).nonzero().flatten()
        positions = positions[positions > 0]  # position 0 is never predicted
        floats.append(aligned[row, positions].tolist())
        tokens = label[positions].tolist()
        pairs.append([[(t, lp), (0, -20.0)] for t, lp in zip(tokens, floats[-1], strict=True)])
    advantages = [1.0, -1.0, 0.5, -0.5]
    losses = {}
    for name, old in (("tensor", aligned), ("floats", floats), ("pairs", pairs)):
        output = model.forward_backward(
            inputs=feats, old_logps=old, advantages=advantages, micro_batch_size=2
        )
        losses[name] = output.loss
    metrics = model.calculate_metric(is_training=True)
    short = [*floats[:3], floats[3][:-1]]
    try:
        model.forward_backward(
            inputs=feats, old_logps=short, advantages=advantages, micro_batch_size=2
        )
        error = None
    except ValueError as exc:
        error = str(exc)
    result = {
        "losses": losses,
        "row_lengths": [len(row) for row in floats],
        "logp_mismatch": metrics["policy/logp_mismatch"],
        "short_row_error": error,
    }
    (out_dir / "rl_inputs.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
