"""init_tinker_client(): the SDK finds the Twinkle server through its own environment, and
takes twinkle:// checkpoint paths (test_twinkle_paths.py tests those calls)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import twinkle
import twinkle_client

TIMEOUT_S = 60
ENV = ("TINKER_BASE_URL", "TINKER_API_KEY", "TWINKLE_SERVER_URL", "TWINKLE_SERVER_TOKEN")


@pytest.fixture
def clean_env(monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_both_documented_imports_are_the_same_function():
    from twinkle import init_tinker_client as from_twinkle
    from twinkle_client import init_tinker_client as from_client

    assert from_twinkle is from_client is twinkle.init_tinker_client


def test_it_copies_the_twinkle_variables(clean_env):
    clean_env.setenv("TWINKLE_SERVER_URL", "http://gpu-box:8000/")
    clean_env.setenv("TWINKLE_SERVER_TOKEN", "tml-from-twinkle")
    twinkle_client.init_tinker_client()
    assert os.environ["TINKER_BASE_URL"] == "http://gpu-box:8000"
    assert os.environ["TINKER_API_KEY"] == "tml-from-twinkle"


def test_arguments_win_then_existing_tinker_variables(clean_env):
    clean_env.setenv("TWINKLE_SERVER_URL", "http://twinkle:1")
    clean_env.setenv("TINKER_BASE_URL", "http://tinker:2")
    clean_env.setenv("TWINKLE_SERVER_TOKEN", "tml-twinkle")
    clean_env.setenv("TINKER_API_KEY", "tml-tinker")
    twinkle.init_tinker_client()
    assert os.environ["TINKER_BASE_URL"] == "http://tinker:2"
    assert os.environ["TINKER_API_KEY"] == "tml-tinker"
    twinkle.init_tinker_client(base_url="http://arg:3", api_key="tml-arg")
    assert os.environ["TINKER_BASE_URL"] == "http://arg:3"
    assert os.environ["TINKER_API_KEY"] == "tml-arg"


def test_with_nothing_set_it_points_at_the_local_twinkle_server(clean_env):
    twinkle.init_tinker_client()
    assert os.environ["TINKER_BASE_URL"] == "http://127.0.0.1:8000"
    assert "TINKER_API_KEY" not in os.environ  # no key to copy; the SDK will say so itself


def test_it_never_imports_the_sdk_but_wraps_it_once_imported():
    code = (
        "import sys, twinkle\n"
        "twinkle.init_tinker_client(base_url='http://h:1', api_key='tml-k')\n"
        "assert 'tinker' not in sys.modules, 'init_tinker_client imported the SDK'\n"
        "from tinker import ServiceClient, types\n"
        "assert ServiceClient.create_sampling_client.__twinkle_paths__\n"
        "parsed = types.ParsedCheckpointTinkerPath.from_tinker_path('twinkle://r:train:0/weights/a')\n"
        "assert parsed.tinker_path == 'tinker://r:train:0/weights/a', parsed\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr


def test_an_sdk_client_made_without_arguments_reaches_the_server(clean_env, tinker_server):
    import tinker

    clean_env.setenv("TWINKLE_SERVER_URL", tinker_server.base_url)
    clean_env.setenv("TWINKLE_SERVER_TOKEN", tinker_server.key_a)
    twinkle.init_tinker_client()
    page = tinker.RestClient().list_training_runs(limit=5).result(TIMEOUT_S)
    assert page.cursor.limit == 5


COOKBOOK = Path(__file__).resolve().parents[4] / "cookbook" / "tinker" / "sft.py"


def test_the_tinker_cookbook_sft_runs_against_the_server(tinker_server):
    env = {
        **os.environ,
        "TWINKLE_SERVER_URL": tinker_server.base_url,
        "TWINKLE_SERVER_TOKEN": tinker_server.key_a,
        "OMP_NUM_THREADS": "1",
    }
    for name in ("TINKER_BASE_URL", "TINKER_API_KEY"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, str(COOKBOOK), "--epochs", "1", "--rows", "8"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Saved checkpoint to tinker://" in done.stderr + done.stdout
