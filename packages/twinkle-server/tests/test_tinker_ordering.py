"""The Tinker seq_id reorder buffer: order, resubmits, rejected seq_ids and lost ones."""

from __future__ import annotations

import time

from twinkle.server.tinker.ordering import SeqOrdering


def recorder():
    ran: list[int] = []
    return ran, lambda seq: lambda: ran.append(seq)


def _no_failure(error: Exception) -> None:
    raise AssertionError(f"unexpected failure: {error}")


def test_out_of_order_arrivals_run_in_seq_order():
    ordering = SeqOrdering(gap_timeout_s=60)
    ordering.open("m", "fut-create")
    ran, job = recorder()
    for seq in (2, 3):  # the SDK sends chunk 1 of a forward_backward last
        ordering.submit("m", seq, f"f{seq}", job(seq), _no_failure)
    assert ran == []
    ordering.submit("m", 1, "f1", job(1), _no_failure)
    assert ran == [1, 2, 3]
    ordering.submit("m", 4, "f4", job(4), _no_failure)
    assert ran == [1, 2, 3, 4]


def test_resubmits_find_the_first_future():
    ordering = SeqOrdering(gap_timeout_s=60)
    ordering.open("m", "fut-create")
    ordering.submit("m", 1, "f1", lambda: None, _no_failure)
    assert ordering.known("m", 0) == "fut-create"
    assert ordering.known("m", 1) == "f1"
    assert ordering.known("m", 2) is None
    assert ordering.known("other", 1) is None


def test_a_rejected_seq_id_does_not_block_the_next():
    ordering = SeqOrdering(gap_timeout_s=60)
    ordering.open("m", "fut-create")
    ran, job = recorder()
    ordering.submit("m", 2, "f2", job(2), _no_failure)
    ordering.skip("m", 1)
    assert ran == [2]


def test_a_lost_seq_id_fails_the_requests_behind_it_after_the_gap_timeout():
    """Running them without it would step without some gradients: they fail, naming it."""
    ordering = SeqOrdering(gap_timeout_s=0.2)
    ordering.open("m", "fut-create")
    ran, job = recorder()
    failed: list[tuple[int, str]] = []

    def fail(seq):
        return lambda error: failed.append((seq, str(error)))

    ordering.submit("m", 3, "f3", job(3), fail(3))
    ordering.submit("m", 2, "f2", job(2), fail(2))
    deadline = time.monotonic() + 5
    while len(failed) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ran == [] and [seq for seq, _ in failed] == [2, 3]
    assert all("seq_id 1 of model m never arrived" in message for _, message in failed)
    ordering.submit("m", 1, "f1", job(1), fail(1))  # late: after its successors failed
    assert ran == [] and failed[-1][0] == 1 and "arrived after" in failed[-1][1]
    ordering.submit("m", 4, "f4", job(4), fail(4))  # the model goes on
    assert ran == [4]


def test_models_are_independent():
    ordering = SeqOrdering(gap_timeout_s=60)
    ordering.open("a", "ca")
    ordering.open("b", "cb")
    ran, job = recorder()
    ordering.submit("a", 2, "a2", job(102), _no_failure)
    ordering.submit("b", 1, "b1", job(201), _no_failure)
    assert ran == [201]
    ordering.submit("a", 1, "a1", job(101), _no_failure)
    assert ran == [201, 101, 102]
