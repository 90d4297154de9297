"""The Tinker seq_id reorder buffer: order, resubmits, rejected seq_ids and lost ones."""

from __future__ import annotations

import time

from twinkle.server.tinker.ordering import SeqOrdering


def recorder():
    ran: list[int] = []
    return ran, lambda seq: lambda: ran.append(seq)


def test_out_of_order_arrivals_run_in_seq_order():
    ordering = SeqOrdering(gap_timeout_s=60)
    ordering.open("m", "fut-create")
    ran, job = recorder()
    for seq in (2, 3):  # the SDK sends chunk 1 of a forward_backward last
        ordering.submit("m", seq, f"f{seq}", job(seq))
    assert ran == []
    ordering.submit("m", 1, "f1", job(1))
    assert ran == [1, 2, 3]
    ordering.submit("m", 4, "f4", job(4))
    assert ran == [1, 2, 3, 4]


def test_resubmits_find_the_first_future():
    ordering = SeqOrdering(gap_timeout_s=60)
    ordering.open("m", "fut-create")
    ordering.submit("m", 1, "f1", lambda: None)
    assert ordering.known("m", 0) == "fut-create"
    assert ordering.known("m", 1) == "f1"
    assert ordering.known("m", 2) is None
    assert ordering.known("other", 1) is None


def test_a_rejected_seq_id_does_not_block_the_next():
    ordering = SeqOrdering(gap_timeout_s=60)
    ordering.open("m", "fut-create")
    ran, job = recorder()
    ordering.submit("m", 2, "f2", job(2))
    ordering.skip("m", 1)
    assert ran == [2]


def test_a_lost_seq_id_is_given_up_after_the_gap_timeout():
    ordering = SeqOrdering(gap_timeout_s=0.2)
    ordering.open("m", "fut-create")
    ran, job = recorder()
    ordering.submit("m", 3, "f3", job(3))
    ordering.submit("m", 2, "f2", job(2))
    assert ran == []
    deadline = time.monotonic() + 5
    while len(ran) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ran == [2, 3]
    ordering.submit("m", 1, "f1", job(1))  # late after its gap was given up: runs at once
    assert ran == [2, 3, 1]


def test_models_are_independent():
    ordering = SeqOrdering(gap_timeout_s=60)
    ordering.open("a", "ca")
    ordering.open("b", "cb")
    ran, job = recorder()
    ordering.submit("a", 2, "a2", job(102))
    ordering.submit("b", 1, "b1", job(201))
    assert ran == [201]
    ordering.submit("a", 1, "a1", job(101))
    assert ran == [201, 101, 102]
