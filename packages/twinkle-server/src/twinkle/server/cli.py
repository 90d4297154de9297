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


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    if not _store(args).revoke_key(args.key, time.time()):
        print(f"no active key with id or name {args.key!r}", file=sys.stderr)
        return 1
    print(f"revoked {args.key}")
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="twinkle-server", description=__doc__)
    sub = top.add_subparsers(dest="command", required=True)

    def command(name: str, func, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        p.add_argument(
            "-c",
            "--config",
            default=None,
            help=f"YAML config (default: the bundled {BUNDLED_CONFIG.name})",
        )
        p.set_defaults(func=func)
        return p

    launch = command(
        "launch", cmd_launch, "serve (mode: embedded or ray on uvicorn, http on Ray Serve)"
    )
    launch.add_argument("--host", default=None)
    launch.add_argument("--port", type=int, default=None)
    command("check-config", cmd_check, "validate a config file")
    command("print-config", cmd_print, "print the effective config")
    keys = sub.add_parser("keys", help="manage API keys").add_subparsers(dest="keys", required=True)
    for name, func, help in (
        ("create", cmd_keys_create, "issue a key"),
        ("list", cmd_keys_list, "list keys"),
        ("revoke", cmd_keys_revoke, "revoke a key"),
    ):
        p = keys.add_parser(name, help=help)
        p.add_argument("-c", "--config", default=None)
        p.set_defaults(func=func)
        if name == "create":
            p.add_argument("--name", required=True)
        if name == "revoke":
            p.add_argument("key", help="key id or name")
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
