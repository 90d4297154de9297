"""The state file's schema versions: an older file upgrades in place, a newer one is refused
untouched, and a migration that fails leaves the old file byte for byte as it was."""

import hashlib
import sqlite3
import time

import pytest

from twinkle.server.store import SQLiteStore, TelemetryEvent
from twinkle.server.store.migrations import (
    MIGRATIONS,
    Migration,
    MigrationError,
    SchemaVersionError,
    migrate,
    schema_version,
)

# What twinkle-server wrote before the schema had versions (user_version 0), verbatim.
UNVERSIONED_TABLES = [
    "CREATE TABLE api_keys (id TEXT PRIMARY KEY, name TEXT NOT NULL, key_hash TEXT NOT NULL "
    "UNIQUE, created_at REAL NOT NULL, revoked_at REAL)",
    "CREATE TABLE training_runs (id TEXT PRIMARY KEY, owner TEXT NOT NULL, session_id TEXT "
    "NOT NULL, base_model TEXT NOT NULL, lora_rank INTEGER NOT NULL, lora_config TEXT NOT "
    "NULL, adapter_name TEXT NOT NULL, created_at REAL NOT NULL, last_request_time REAL NOT "
    "NULL, active INTEGER NOT NULL, user_metadata TEXT NOT NULL)",
]


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _file_at(path, migrations) -> None:
    db = sqlite3.connect(str(path), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    migrate(db, str(path), migrations)
    db.execute(
        "INSERT INTO training_runs VALUES ('r1', 'alice', 's1', 'bundled://tiny', 4, '{}', "
        "'default', 1.0, 1.0, 1, '{}')"
    )
    db.close()


def test_a_file_from_before_versioning_upgrades_in_place_keeping_its_records(tmp_path):
    path = tmp_path / "state.db"
    db = sqlite3.connect(str(path), isolation_level=None)
    for statement in UNVERSIONED_TABLES:
        db.execute(statement)
    db.execute(
        "INSERT INTO training_runs VALUES ('r1', 'alice', 's1', 'bundled://tiny', 4, '{}', "
        "'default', 1.0, 1.0, 1, '{}')"
    )
    db.close()

    store = SQLiteStore(path)
    assert store.get_run("alice", "r1").base_model == "bundled://tiny"
    store.add_usage("alice", {"train_tokens": 7}, time.time())  # a table version 2 added
    assert [u.amount for u in store.usage("alice")] == [7.0]
    store.close()
    db = sqlite3.connect(str(path))
    assert schema_version(db) == MIGRATIONS[-1].version


def test_a_version_1_file_gains_the_later_tables_and_keeps_its_runs(tmp_path):
    path = tmp_path / "state.db"
    _file_at(path, MIGRATIONS[:1])
    store = SQLiteStore(path)
    assert [r.id for r in store.list_runs("alice", 10, 0)[0]] == ["r1"]
    store.add_telemetry([TelemetryEvent("alice", "s1", 2.0, "linux", "0.38", {"event": "x"})])
    assert store.list_telemetry("alice", 5)[0].event == {"event": "x"}
    assert store.list_telemetry("bob", 5) == []


def test_a_newer_file_is_refused_with_the_versions_and_left_unchanged(tmp_path):
    path = tmp_path / "state.db"
    newer = MIGRATIONS + (Migration(MIGRATIONS[-1].version + 1, "future", ("CREATE TABLE z (a)",)),)
    _file_at(path, newer)
    before = _sha(path)
    with pytest.raises(SchemaVersionError, match=r"schema version \d+, written by a newer"):
        SQLiteStore(path)
    assert _sha(path) == before


def test_a_failing_migration_leaves_the_old_file_byte_for_byte(tmp_path):
    path = tmp_path / "state.db"
    _file_at(path, MIGRATIONS[:1])
    before = _sha(path)
    broken = Migration(
        2, "a broken upgrade", ("CREATE TABLE half (a)", "INSERT INTO nope VALUES (1)")
    )
    db = sqlite3.connect(str(path), isolation_level=None)
    with pytest.raises(MigrationError, match="migration 2 .*unchanged, still at version 1"):
        migrate(db, str(path), MIGRATIONS[:1] + (broken,))
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "half" not in tables and schema_version(db) == 1
    db.close()
    assert _sha(path) == before
    store = SQLiteStore(path)  # the real upgrade still works afterwards
    assert store.get_run("alice", "r1") is not None


def test_migrations_are_numbered_one_by_one():
    assert [m.version for m in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))


def test_usage_adds_up_per_key_and_day(tmp_path):
    store = SQLiteStore(tmp_path / "s.db")
    day1, day2 = 1_700_000_000.0, 1_700_000_000.0 + 86_400
    store.add_usage("alice", {"train_tokens": 10, "requests": 1}, day1)
    store.add_usage("alice", {"train_tokens": 5, "requests": 1}, day1)
    store.add_usage("alice", {"requests": 1}, day2)
    store.add_usage("bob", {"sampled_tokens": 3}, day1)
    rows = {(u.day, u.metric): u.amount for u in store.usage("alice")}
    assert rows == {
        ("2023-11-14", "requests"): 2.0,
        ("2023-11-14", "train_tokens"): 15.0,
        ("2023-11-15", "requests"): 1.0,
    }
    assert {u.owner for u in store.usage()} == {"alice", "bob"}


def test_the_command_refuses_a_newer_state_file_with_its_message(tmp_path, capsys):
    from twinkle.server.cli import main

    newer = MIGRATIONS + (Migration(MIGRATIONS[-1].version + 1, "future", ("CREATE TABLE z (a)",)),)
    _file_at(tmp_path / "state.db", newer)
    config = tmp_path / "c.yaml"
    config.write_text(f"storage: {{home: '{tmp_path}', database: '{tmp_path / 'state.db'}'}}\n")
    assert main(["keys", "list", "-c", str(config)]) == 2
    assert "written by a newer twinkle-server" in capsys.readouterr().err


def test_a_version_3_file_gains_loss_curves_in_one_step_and_keeps_its_runs(tmp_path):
    path = tmp_path / "state.db"
    _file_at(path, MIGRATIONS[:3])
    store = SQLiteStore(path)
    assert schema_version(store._db) == MIGRATIONS[-1].version
    assert [r.id for r in store.list_runs("alice", 10, 0)[0]] == ["r1"]
    store.add_loss("alice", "r1", 1.0, 2.5, keep=10)
    assert store.losses("alice", "r1") == [(1.0, 2.5)]
    store.close()


def test_a_loss_curve_keeps_its_latest_points_per_run_and_survives_reopening(tmp_path):
    path = tmp_path / "state.db"
    store = SQLiteStore(path)
    for step in range(7):
        store.add_loss("alice", "r1", float(step), 10.0 - step, keep=4)
    store.add_loss("alice", "r2", 0.5, 1.0, keep=4)
    store.add_loss("bob", "r1", 0.5, 9.0, keep=4)  # another key's run of the same id
    store.close()
    store = SQLiteStore(path)
    assert store.losses("alice", "r1") == [(3.0, 7.0), (4.0, 6.0), (5.0, 5.0), (6.0, 4.0)]
    assert store.losses("alice", "r2") == [(0.5, 1.0)]
    assert store.losses("bob", "r1") == [(0.5, 9.0)]
    assert store.losses("carol", "r1") == []
    store.close()
