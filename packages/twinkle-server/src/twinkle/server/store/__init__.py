"""The service's durable state behind a small interface; SQLite is the default backend."""

from twinkle.server.store.base import (
    ApiKey,
    CheckpointRecord,
    FutureRecord,
    SessionRecord,
    Store,
    TelemetryEvent,
    TrainingRun,
    UsageRecord,
)
from twinkle.server.store.sqlite import SQLiteStore

__all__ = [
    "ApiKey",
    "CheckpointRecord",
    "FutureRecord",
    "SQLiteStore",
    "SessionRecord",
    "Store",
    "TelemetryEvent",
    "TrainingRun",
    "UsageRecord",
]
