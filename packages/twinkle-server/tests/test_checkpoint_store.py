"""The store's checkpoint lifecycle: a state file from before publishing and TTLs upgrades
with every checkpoint private and lasting; published and expired ones are found as such."""

import sqlite3

from twinkle.server.store import CheckpointRecord, SQLiteStore
from twinkle.server.store.migrations import MIGRATIONS, migrate


def test_a_state_file_from_before_publishing_upgrades_with_private_lasting_checkpoints(tmp_path):
    path = tmp_path / "state.db"
    db = sqlite3.connect(str(path), isolation_level=None)
    migrate(db, str(path), MIGRATIONS[:2])
    db.execute("INSERT INTO checkpoints VALUES ('r1', 'weights', 'c', 'alice', '/x', 10, 1.0, 1)")
    db.close()
    store = SQLiteStore(path)
    record = store.get_checkpoint("alice", "r1", "weights", "c")
    assert (record.public, record.expires_at, record.has_optimizer) == (False, None, True)
    assert store.public_checkpoint("r1", "weights", "c") is None
    assert store.set_checkpoint_public("alice", "r1", "weights", "c", True)
    assert not store.set_checkpoint_public("bob", "r1", "weights", "c", False)  # not bob's
    assert store.public_checkpoint("r1", "weights", "c").owner == "alice"
    store.add_checkpoint(
        CheckpointRecord("r1", "weights", "d", "alice", "/y", 1, 2.0, False, False, 5.0)
    )
    assert [r.name for r in store.expired_checkpoints(6.0)] == ["d"]
    assert store.expired_checkpoints(4.0) == []
    store.close()
