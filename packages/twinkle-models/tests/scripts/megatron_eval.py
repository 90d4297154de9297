"""One CPU process: MegatronModel evaluates as the Qwen3.5 page writes it.

Usage: python megatron_eval.py OUT_DIR. Writes ``OUT_DIR/eval.json``: after one training
``forward_backward``, the page's loop (``forward_only(inputs=batch)``, ``calculate_loss()``,
``calculate_metric(is_training=False)``) on two batches, the losses each call reported, the
training metrics next to those of a model that did not evaluate, and the error of
``calculate_loss()`` after a ``forward_backward``; ``forward`` (the data-flow page's) against
``forward_only``, and ``backward()``'s refusal. A separate process, as Megatron's parallel
state is global.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from twinkle.model import MegatronModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from megatron_parallel import MODEL, features  # noqa: E402


def main() -> None:
    out_dir = Path(sys.argv[1])
    feats = features()
    model = MegatronModel(MODEL, device="cpu")
    model.set_optimizer("default", lr=1e-3)
    model.forward_backward(feats)
    tokens_before = model._state(None).pending_tokens
    evaluated = []
    for batch in (feats[:2], feats[2:]):
        output = model.forward_only(inputs=batch)
        loss = model.calculate_loss()
        metrics = model.calculate_metric(is_training=False)
        evaluated.append({"forward_only": output.loss, "calculate_loss": loss, "metric": metrics})
    result = {
        "evaluated": evaluated,
        "pending_tokens": [tokens_before, model._state(None).pending_tokens],
        "training_metrics": model.calculate_metric(is_training=True),
    }
    # The data-flow page's actor.forward(input_data): forward_only's pass; no separate backward.
    forwarded, evaluated_logps = model.forward(feats), model.forward_only(feats)
    result["forward_equals_forward_only"] = bool((forwarded.logps == evaluated_logps.logps).all())
    result["forward_rows"] = int(forwarded.logps.shape[0])
    try:
        model.backward()
        result["backward_error"] = None
    except ValueError as exc:
        result["backward_error"] = str(exc)
    untouched = MegatronModel(MODEL, device="cpu")
    untouched.set_optimizer("default", lr=1e-3)
    untouched.forward_backward(feats)
    result["untouched_training_metrics"] = untouched.calculate_metric(is_training=True)
    try:
        untouched.calculate_loss()
        result["after_forward_backward"] = None
    except ValueError as exc:
        result["after_forward_backward"] = str(exc)
    (out_dir / "eval.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
