"""SQLiteStore: owner filtering, durability across reopen, idempotency keys, start-up repair."""

import time

import pytest

from twinkle.server.store import (
    ApiKey,
    CheckpointRecord,
    FutureRecord,
    SessionRecord,
    SQLiteStore,
    TrainingRun,
)


def _run(run_id: str, owner: str) -> TrainingRun:
    now = time.time()
    return TrainingRun(
        run_id, owner, "sess-1", "bundled://tiny-qwen3", 4, {"r": 4}, "default", now, now
    )


def test_records_are_filtered_by_owner_and_survive_reopen(tmp_path):
    store = SQLiteStore(tmp_path / "state.db")
    store.add_run(_run("sess-1:train:0", "alice"))
    store.add_run(_run("sess-2:train:0", "bob"))
    store.add_checkpoint(
        CheckpointRecord("sess-1:train:0", "weights", "c1", "alice", "/x", 10, time.time())
    )
    store.close()

    store = SQLiteStore(tmp_path / "state.db")
    runs, total = store.list_runs("alice", 10, 0)
    assert [r.id for r in runs] == ["sess-1:train:0"] and total == 1
    assert store.get_run("bob", "sess-1:train:0") is None
    assert store.get_checkpoint("bob", "sess-1:train:0", "weights", "c1") is None
    assert not store.delete_checkpoint("bob", "sess-1:train:0", "weights", "c1")
    assert store.get_checkpoint("alice", "sess-1:train:0", "weights", "c1").size_bytes == 10
    assert store.list_checkpoints("bob") == []


def test_pagination_counts_all_of_an_owners_runs(tmp_path):
    store = SQLiteStore(tmp_path / "s.db")
    for i in range(5):
        store.add_run(_run(f"sess-1:train:{i}", "alice"))
    page, total = store.list_runs("alice", 2, 2)
    assert [r.id for r in page] == ["sess-1:train:2", "sess-1:train:3"] and total == 5


def test_idempotency_key_is_unique_per_owner(tmp_path):
    store = SQLiteStore(tmp_path / "s.db")
    store.add_future(FutureRecord("f1", "alice", "step", "pending", 0.0, "k"))
    store.add_future(FutureRecord("f2", "bob", "step", "pending", 0.0, "k"))  # other owner: ok
    with pytest.raises(Exception, match="UNIQUE"):
        store.add_future(FutureRecord("f3", "alice", "step", "pending", 0.0, "k"))
    assert store.future_by_idempotency_key("alice", "k").id == "f1"
    assert store.get_future("bob", "f1") is None


def test_pending_futures_fail_after_a_restart(tmp_path):
    store = SQLiteStore(tmp_path / "s.db")
    store.add_future(FutureRecord("f1", "alice", "step", "pending", 0.0))
    store.add_future(FutureRecord("f2", "alice", "step", "pending", 0.0))
    store.finish_future("f2", "done", None, None, 1.0)
    assert store.fail_pending_futures({"error": "restart", "category": "server"}, 2.0) == 1
    assert store.get_future("alice", "f1").status == "failed"
    assert store.get_future("alice", "f2").status == "done"
    store.add_future(FutureRecord("f3", "alice", "step", "pending", 0.0))
    assert store.prune_futures(before=0.5) == 2  # f1 and f2 are finished; f3 still runs
    assert store.get_future("alice", "f3") is not None and store.get_future("alice", "f1") is None


def test_keys_revoke_by_id_or_name_and_sessions_expire(tmp_path):
    store = SQLiteStore(tmp_path / "s.db")
    store.add_key(ApiKey("key-1", "alice", "h1", 0.0))
    assert store.revoke_key("alice", 5.0) and not store.revoke_key("alice", 6.0)
    assert store.key_by_hash("h1").revoked_at == 5.0
    store.add_session(SessionRecord("sess-1", "alice", 0.0, 100.0))
    assert store.next_model_seq("sess-1") == 0 and store.next_model_seq("sess-1") == 1
    assert [s.id for s in store.expired_sessions(before=150.0)] == ["sess-1"]
    assert store.expired_sessions(before=50.0) == []
