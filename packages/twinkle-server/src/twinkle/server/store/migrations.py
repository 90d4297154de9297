"""The state file's schema as numbered migrations, so a file written by an older server
upgrades in place and one written by a newer server is refused before anything is touched.

SQLite's ``PRAGMA user_version`` holds the version a file is at (0: a new file, or one from
before versioning, whose tables version 1 creates only where missing). Opening a file
applies every migration above its version in ONE transaction together with the new
version number: a migration that fails rolls all of them back, so the file stays exactly
as it was, at its old version. To change the schema, append a Migration with the next
number (never edit a released one); see docs/server.md's "State file" section.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass


@dataclass(frozen=True)
class Migration:
    version: int
    why: str
    statements: tuple[str, ...]


class SchemaVersionError(RuntimeError):
    """The state file was written by a newer twinkle-server than this one."""


class MigrationError(RuntimeError):
    """A migration failed; the state file was left at its old version, unchanged."""


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "keys, sessions, training runs, checkpoints and futures",
        (
            """CREATE TABLE IF NOT EXISTS api_keys (
                id TEXT PRIMARY KEY, name TEXT NOT NULL, key_hash TEXT NOT NULL UNIQUE,
                created_at REAL NOT NULL, revoked_at REAL)""",
            """CREATE TABLE IF NOT EXISTS sessions (
                id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at REAL NOT NULL,
                last_heartbeat REAL NOT NULL, closed_at REAL, model_seq INTEGER NOT NULL,
                metadata TEXT NOT NULL)""",
            """CREATE TABLE IF NOT EXISTS training_runs (
                id TEXT PRIMARY KEY, owner TEXT NOT NULL, session_id TEXT NOT NULL,
                base_model TEXT NOT NULL, lora_rank INTEGER NOT NULL, lora_config TEXT NOT NULL,
                adapter_name TEXT NOT NULL, created_at REAL NOT NULL,
                last_request_time REAL NOT NULL, active INTEGER NOT NULL,
                user_metadata TEXT NOT NULL)""",
            "CREATE INDEX IF NOT EXISTS runs_by_owner ON training_runs (owner, created_at)",
            """CREATE TABLE IF NOT EXISTS checkpoints (
                run_id TEXT NOT NULL, kind TEXT NOT NULL, name TEXT NOT NULL,
                owner TEXT NOT NULL, path TEXT NOT NULL, size_bytes INTEGER NOT NULL,
                created_at REAL NOT NULL, has_optimizer INTEGER NOT NULL,
                PRIMARY KEY (run_id, kind, name))""",
            """CREATE TABLE IF NOT EXISTS futures (
                id TEXT PRIMARY KEY, owner TEXT NOT NULL, operation TEXT NOT NULL,
                status TEXT NOT NULL, created_at REAL NOT NULL, idempotency_key TEXT,
                result TEXT, error TEXT, finished_at REAL)""",
            "CREATE UNIQUE INDEX IF NOT EXISTS futures_by_key ON futures (owner, idempotency_key)",
        ),
    ),
    Migration(
        2,
        "usage per key and day, and the Tinker SDK's telemetry events",
        (
            """CREATE TABLE usage (
                owner TEXT NOT NULL, day TEXT NOT NULL, metric TEXT NOT NULL,
                amount REAL NOT NULL, PRIMARY KEY (owner, day, metric))""",
            """CREATE TABLE telemetry (
                id INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT NOT NULL,
                session_id TEXT, received_at REAL NOT NULL, platform TEXT,
                sdk_version TEXT, event TEXT NOT NULL)""",
            "CREATE INDEX telemetry_by_owner ON telemetry (owner, received_at)",
        ),
    ),
    Migration(
        3,
        "checkpoints that other keys may read (published) and that expire (TTL)",
        (
            "ALTER TABLE checkpoints ADD COLUMN public INTEGER NOT NULL DEFAULT 0",
            "ALTER TABLE checkpoints ADD COLUMN expires_at REAL",
            "CREATE INDEX checkpoints_by_expiry ON checkpoints (expires_at)",
        ),
    ),
    Migration(
        4,
        "each training run's loss curve (the dashboard's), kept across restarts",
        (
            """CREATE TABLE losses (
                id INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT NOT NULL,
                run_id TEXT NOT NULL, at REAL NOT NULL, loss REAL NOT NULL)""",
            "CREATE INDEX losses_by_run ON losses (owner, run_id, id)",
        ),
    ),
)


def schema_version(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def refuse_newer(db: sqlite3.Connection, path: str, migrations: tuple[Migration, ...]) -> None:
    """Raise before anything writes to a file this server's schema does not describe."""
    version, latest = schema_version(db), migrations[-1].version
    if version > latest:
        raise SchemaVersionError(
            f"the state file {path} is at schema version {version}, written by a newer "
            f"twinkle-server; this one knows versions up to {latest}. Upgrade twinkle-server, "
            "or set storage.database to another file (this one was left unchanged)"
        )


def migrate(
    db: sqlite3.Connection, path: str, migrations: tuple[Migration, ...] = MIGRATIONS
) -> int:
    """Bring the file to the latest version (``db`` in autocommit mode); returns it."""
    refuse_newer(db, path, migrations)
    old = schema_version(db)
    pending = [m for m in migrations if m.version > old]
    if not pending:
        return old
    db.execute("BEGIN IMMEDIATE")
    try:
        for migration in pending:
            _apply(db, path, old, migration)
        db.execute(f"PRAGMA user_version = {pending[-1].version}")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return pending[-1].version


def _apply(db: sqlite3.Connection, path: str, old: int, migration: Migration) -> None:
    try:
        for statement in migration.statements:
            db.execute(statement)
    except sqlite3.Error as exc:
        raise MigrationError(
            f"upgrading the state file {path} from schema version {old} failed at migration "
            f"{migration.version} ({migration.why}): {exc}. The file is unchanged, still at "
            f"version {old}; the previous twinkle-server can keep using it"
        ) from exc
