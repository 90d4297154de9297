"""The ``twinkle-server`` command: launch, check-config, print-config, keys create/list/revoke."""

from __future__ import annotations

import argparse
import sys
import time

from twinkle.server.config import (
    BUNDLED_CONFIG,
    ServerConfig,
    check_allow_lists,
    dump_config,
    load_config,
)
from twinkle.server.store.migrations import MigrationError, SchemaVersionError

DESCRIPTION = """\
The Twinkle training service: one base model, many tenants' LoRA adapters, the Twinkle and
Tinker APIs over HTTP, state in SQLite. Start it with `twinkle-server launch -c config.yaml`;
manage API keys with `twinkle-server keys ...`. Without -c, the bundled CPU config serves the
tiny bundled model on 127.0.0.1."""


def _config(args: argparse.Namespace) -> ServerConfig:
    return load_config(
        args.config, host=getattr(args, "host", None), port=getattr(args, "port", None)
    )


def cmd_launch(args: argparse.Namespace) -> int:
    from twinkle.server.serve import launch

    config = _config(args)
    problems = check_allow_lists(config)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2
    launch(config)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    config = _config(args)
    problems = check_allow_lists(config)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    print(
        f"config ok: {config.model.model_id} on {config.host}:{config.port}, "
        f"{config.model.max_loras} LoRA slots, state in {config.storage.database_path()}"
    )
    return 0


def cmd_print(args: argparse.Namespace) -> int:
    print(dump_config(_config(args)), end="")
    return 0


def _store(args: argparse.Namespace):
    from twinkle.server.store import SQLiteStore

    return SQLiteStore(_config(args).storage.database_path())


def cmd_keys_create(args: argparse.Namespace) -> int:
    from twinkle.server.auth import create_key

    key, record = create_key(_store(args), args.name)
    print(key)
    print(f"created key {record.id} ({record.name}); it is shown only once", file=sys.stderr)
    return 0


def cmd_keys_list(args: argparse.Namespace) -> int:
    for key in _store(args).list_keys():
        status = "revoked" if key.revoked_at else "active"
        created = time.strftime("%Y-%m-%d %H:%M", time.gmtime(key.created_at))
        print(f"{key.id}\t{key.name}\t{status}\t{created}")
    return 0


def cmd_usage(args: argparse.Namespace) -> int:
    """Each key's recorded usage per UTC day (``Store.usage``), one line per metric."""
    store = _store(args)
    names = {key.id: key.name for key in store.list_keys()}
    for row in store.usage():
        if args.key in (None, row.owner, names.get(row.owner)):
            print(
                f"{row.day}\t{row.owner}\t{names.get(row.owner, '?')}\t{row.metric}\t{row.amount:g}"
            )
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    if not _store(args).revoke_key(args.key, time.time()):
        print(f"no active key with id or name {args.key!r}", file=sys.stderr)
        return 1
    print(f"revoked {args.key}")
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="twinkle-server",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(parent, name: str, func, help: str) -> argparse.ArgumentParser:
        p = parent.add_parser(name, help=help, description=help)
        p.add_argument(
            "-c",
            "--config",
            default=None,
            help=f"YAML config file (default: the bundled {BUNDLED_CONFIG.name})",
        )
        p.set_defaults(func=func)
        return p

    launch = command(
        sub, "launch", cmd_launch, "serve (mode: embedded or ray on uvicorn, http on Ray Serve)"
    )
    launch.add_argument("--host", default=None, help="address to bind (default: the config's)")
    launch.add_argument("--port", type=int, default=None, help="port (default: the config's)")
    command(sub, "check-config", cmd_check, "validate a config file and its allow-lists")
    command(sub, "print-config", cmd_print, "print the effective config, defaults filled in")
    keys_parser = sub.add_parser("keys", help="manage API keys", description="manage API keys")
    keys = keys_parser.add_subparsers(dest="keys", required=True, metavar="ACTION")
    create = command(keys, "create", cmd_keys_create, "issue a key (printed once)")
    create.add_argument("--name", required=True, help="a label for the key's owner")
    command(keys, "list", cmd_keys_list, "list keys: id, name, status, creation time")
    revoke = command(keys, "revoke", cmd_keys_revoke, "revoke a key")
    revoke.add_argument("key", help="key id or name")
    usage = command(sub, "usage", cmd_usage, "usage per key and day: requests, tokens")
    usage.add_argument("--key", default=None, help="only this key (id or name)")
    return top


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("twinkle-server")
    except PackageNotFoundError:  # a source tree run without installing
        return "unknown (twinkle-server not installed)"


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except (FileNotFoundError, ValueError, SchemaVersionError, MigrationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
