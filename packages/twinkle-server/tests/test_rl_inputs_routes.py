"""RL loss inputs through the Twinkle model routes, as the client sends them.

``old_logps`` arrive as JSON in either documented shape: one float per completion token, or
the sampler's per-token lists of ``[token_id, logprob]`` pairs (``seq.get('logprobs', [])``).
Both train alike; a row of the wrong length or nesting, or a loss missing its inputs, is a
400 naming the row, the field and both lengths, never a 500, and the run keeps serving.
"""

from __future__ import annotations

import re

import pytest

# Label tokens at positions 2..5 (position 0 is never predicted): four per row.
FEATURE = {"input_ids": [1, 2, 3, 4, 5, 6], "labels": [-100, -100, 3, 4, 5, 6]}
LOGPS = [-1.0, -1.25, -0.75, -1.5]
PAIRS = [[[token, logp], [7, -3.0]] for token, logp in zip([3, 4, 5, 6], LOGPS, strict=True)]


@pytest.fixture(scope="module")
def grpo(server, make_tenant):
    state, http, keys = server
    alice = make_tenant(http, keys["alice"])
    run = alice.new_run()
    alice.ok(run, "set_loss", loss="GRPOLoss", epsilon=0.2)
    return alice, run


def test_both_old_logps_shapes_give_one_loss(grpo):
    alice, run = grpo
    flat = alice.ok(
        run, "forward_only", inputs=[FEATURE] * 2, old_logps=[LOGPS] * 2, advantages=[1.0, -2.0]
    )
    pairs = alice.ok(
        run, "forward_only", inputs=[FEATURE] * 2, old_logps=[PAIRS] * 2, advantages=[1.0, -2.0]
    )
    on_policy = alice.ok(run, "forward_only", inputs=[FEATURE] * 2, advantages=[1.0, -2.0])
    assert pairs["loss"] == flat["loss"]
    assert pairs["loss"] != on_policy["loss"]  # the old logps took part
    trained = alice.ok(
        run, "forward_backward", inputs=[FEATURE] * 2, old_logps=[PAIRS] * 2, advantages=[1.0, -2.0]
    )
    assert trained["loss"] == pytest.approx(flat["loss"], rel=1e-6)


@pytest.mark.parametrize(
    ("old_logps", "message"),
    [
        ([LOGPS, LOGPS[:3]], r"old_logps\[1\] has 3 values but row 1 of the batch has 4 label"),
        ([PAIRS, PAIRS[1:]], r"old_logps\[1\] has 3 values but row 1 of the batch has 4 label"),
        ([LOGPS], r"old_logps must be .* one row per sequence \(2 rows in this batch\), got 1"),
        ([LOGPS, [[p] for p in PAIRS]], r"old_logps\[1\]\[0\] is .*\(token_id, logprob\) pairs"),
        ([LOGPS, [[[9, lp]] for lp in LOGPS]], r"old_logps\[1\] holds the sampler's logprobs of"),
    ],
)
def test_a_wrong_old_logps_row_is_a_400_naming_it(grpo, old_logps, message):
    alice, run = grpo
    for method in ("forward_backward", "forward_only"):
        response = alice.call(
            run, method, inputs=[FEATURE] * 2, old_logps=old_logps, advantages=[1.0, 1.0]
        )
        assert response.status_code == 400, response.text
        body = response.json()
        assert body["category"] == "user" and "Traceback" not in response.text
        assert body["error"].startswith(f"{method}: ")
        assert re.search(message, body["error"]), body["error"]
    assert alice.ok(run, "forward_only", inputs=[FEATURE], advantages=[1.0])["loss"] is not None


def test_a_loss_missing_its_inputs_is_a_400(grpo):
    alice, run = grpo
    response = alice.call(run, "forward_backward", inputs=[FEATURE])
    assert response.status_code == 400, response.text
    assert "GRPOLoss needs advantages" in response.json()["error"]
