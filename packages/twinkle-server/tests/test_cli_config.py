"""The twinkle-server command and its config: checked before anything starts."""

import pytest
import yaml

from twinkle.server.cli import main
from twinkle.server.config import BUNDLED_CONFIG, load_config


def test_the_bundled_config_serves_the_tiny_model_on_cpu():
    config = load_config()
    assert config.model.model_id == "bundled://tiny-qwen3" and config.model.device == "cpu"
    assert load_config(BUNDLED_CONFIG, host="0.0.0.0", port=9001).port == 9001


def test_unknown_config_keys_and_bad_values_are_refused(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("model: {max_lora: 4}\n")
    with pytest.raises(ValueError, match="max_lora"):
        load_config(bad)
    bad.write_text("port: 99999\n")
    with pytest.raises(ValueError, match="port"):
        load_config(bad)


def test_check_config_names_an_allow_list_entry_no_registry_knows(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(f"storage: {{home: '{tmp_path}'}}\n")
    assert main(["check-config", "-c", str(config)]) == 0
    config.write_text(f"storage: {{home: '{tmp_path}'}}\nallow: {{losses: [NoSuchLoss]}}\n")
    assert main(["check-config", "-c", str(config)]) == 1
    assert "NoSuchLoss" in capsys.readouterr().err


def test_print_config_round_trips(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("port: 8123\nmodel: {max_loras: 2}\n")
    assert main(["print-config", "-c", str(config)]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["port"] == 8123 and printed["model"]["max_loras"] == 2


def test_keys_create_list_revoke(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(f"storage: {{home: '{tmp_path}'}}\n")
    assert main(["keys", "create", "--name", "alice", "-c", str(config)]) == 0
    key = capsys.readouterr().out.strip()
    assert key.startswith("tml-")
    assert main(["keys", "list", "-c", str(config)]) == 0
    listing = capsys.readouterr().out
    assert "alice\tactive" in listing and key not in listing
    assert main(["keys", "revoke", "alice", "-c", str(config)]) == 0
    main(["keys", "list", "-c", str(config)])
    assert "alice\trevoked" in capsys.readouterr().out
    assert main(["keys", "revoke", "alice", "-c", str(config)]) == 1


def test_missing_config_file_is_a_clear_error(tmp_path, capsys):
    assert main(["check-config", "-c", str(tmp_path / "absent.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def _every_action(parser):
    """Every option of a parser and of its subcommands, with the parser that owns it."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _every_action(sub)
        else:
            yield parser.prog, action


def test_help_describes_every_flag_and_version_prints_the_distribution_version(capsys):
    from importlib.metadata import version

    from twinkle.server.cli import parser

    undocumented = [f"{prog} {a.dest}" for prog, a in _every_action(parser()) if not a.help]
    assert undocumented == []
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: twinkle-server") and "``" not in out  # no raw markup
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"twinkle-server {version('twinkle-server')}"


def test_usage_prints_each_keys_daily_totals(tmp_path, capsys):
    from twinkle.server.store import SQLiteStore

    config = tmp_path / "c.yaml"
    config.write_text(f"storage: {{home: '{tmp_path}'}}\n")
    assert main(["keys", "create", "--name", "alice", "-c", str(config)]) == 0
    assert main(["keys", "create", "--name", "bob", "-c", str(config)]) == 0
    store = SQLiteStore(tmp_path / "state.db")
    alice, bob = (k.id for k in store.list_keys())
    store.add_usage(alice, {"train_tokens": 12, "requests": 2}, 1_700_000_000.0)
    store.add_usage(bob, {"sampled_tokens": 5}, 1_700_000_000.0)
    store.close()
    capsys.readouterr()
    assert main(["usage", "--key", "alice", "-c", str(config)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"2023-11-14\t{alice}\talice\trequests\t2",
        f"2023-11-14\t{alice}\talice\ttrain_tokens\t12",
    ]
    assert main(["usage", "-c", str(config)]) == 0
    assert "sampled_tokens\t5" in capsys.readouterr().out
