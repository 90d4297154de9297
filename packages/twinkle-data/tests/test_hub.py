"""twinkle.hub: every id kind resolves to the right local path, and every bad id fails clearly.

Hub ids are tested against local mirrors of each hub's cache layout; no test
touches the network. Downloads are either forbidden (offline env vars) or
pointed at a local port that refuses connections, so a test that wrongly went
online would fail at once instead of waiting on a timeout.
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest

from twinkle.hub import (
    BUNDLED_ROOT,
    HubError,
    bundled_ids,
    default_hub,
    parse_id,
    resolve_dataset,
    resolve_model,
)
from twinkle.hub.ids import BundledId, HubId, LocalId

BUNDLED_DATASETS = ["bundled://countdown", "bundled://gsm8k", "bundled://self-cognition"]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def refused_endpoint():
    """An http URL on a port that is bound but not listening: connecting fails at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture(autouse=True)
def hub_env(monkeypatch, tmp_path, refused_endpoint):
    """Offline hubs with empty caches under tmp_path, and endpoints that refuse connections."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("TWINKLE_DEFAULT_HUB", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("TWINKLE_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_ENDPOINT", refused_endpoint)
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "ms"))
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", refused_endpoint)


def go_online(monkeypatch):
    """Allow downloads; the refused endpoints make any network attempt fail immediately."""
    monkeypatch.delenv("TWINKLE_HUB_OFFLINE")
    monkeypatch.delenv("HF_HUB_OFFLINE")


def hf_snapshot(cache: Path, kind: str, repo_id: str, ref: str = "main") -> Path:
    """Lay out a Hugging Face cache entry: refs/<ref> holds the commit, snapshots/<commit>/."""
    repo = cache / f"{kind}s--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text('{"model_type": "qwen3"}')
    (repo / "refs").mkdir()
    (repo / "refs" / ref).write_text(COMMIT)
    return snapshot


def ms_snapshot(cache: Path, kind: str, repo_id: str, revision: str = "master") -> Path:
    """Lay out a ModelScope (>= 1.38) cache entry: <kind>s/org--name/snapshots/<revision>/."""
    snapshot = cache / f"{kind}s" / repo_id.replace("/", "--") / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (snapshot / "train.jsonl").write_text('{"query": "hi", "response": "hello"}\n')
    return snapshot


# Bundled ids


def test_bundled_model_is_the_tiny_qwen3_folder():
    path = resolve_model("bundled://tiny-qwen3")
    assert path == BUNDLED_ROOT / "models" / "tiny-qwen3"
    assert (path / "config.json").is_file() and (path / "tokenizer.json").is_file()


@pytest.mark.parametrize("dataset_id", BUNDLED_DATASETS)
def test_bundled_datasets_are_folders_of_split_files(dataset_id):
    path = resolve_dataset(dataset_id)
    assert path == BUNDLED_ROOT / "datasets" / dataset_id.removeprefix("bundled://")
    assert len(list(path.glob("**/train.jsonl"))) == 1, "one train split, maybe under a subset"


BUNDLED_MODELS = [
    f"bundled://tiny-{family}"
    for family in (
        "deepseek-v3",
        "gemma3",
        "glm4.5",
        "llama3",
        "mistral",
        "phi4",
        "qwen2.5",
        "qwen3",
        "qwen3-moe",
        "qwen3.5",
        "qwen3.5-moe",
    )
]


def test_bundled_ids_lists_every_bundled_model_and_dataset():
    assert bundled_ids("model") == BUNDLED_MODELS
    assert bundled_ids("dataset") == BUNDLED_DATASETS
    assert bundled_ids() == [*BUNDLED_MODELS, *BUNDLED_DATASETS]


def test_unknown_bundled_id_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown bundled dataset bundled://gsm9k") as info:
        resolve_dataset("bundled://gsm9k")
    assert all(known in str(info.value) for known in BUNDLED_DATASETS)
    with pytest.raises(ValueError, match="bundled models are: bundled://tiny-deepseek-v3") as info:
        resolve_model("bundled://tiny-llama")
    assert all(known in str(info.value) for known in BUNDLED_MODELS)


def test_bundled_id_of_the_other_kind_points_to_the_other_resolver():
    with pytest.raises(ValueError, match="bundled dataset, not a model.*resolve_dataset"):
        resolve_model("bundled://gsm8k")
    with pytest.raises(ValueError, match="bundled model, not a dataset.*resolve_model"):
        resolve_dataset("bundled://tiny-qwen3")


def test_bundled_ids_have_no_revisions():
    with pytest.raises(ValueError, match="no revisions"):
        resolve_model("bundled://tiny-qwen3@v1")
    with pytest.raises(ValueError, match="no revisions"):
        resolve_dataset("bundled://gsm8k", revision="v1")


# Local paths


def test_absolute_relative_home_and_pathlike_paths_go_straight_to_disk(tmp_path, monkeypatch):
    folder = tmp_path / "home" / "my-model"
    folder.mkdir(parents=True)
    data_file = folder / "data.jsonl"
    data_file.write_text("{}\n")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path / "home")
    assert resolve_model(str(folder)) == folder
    assert resolve_model(folder) == folder
    assert resolve_model("my-model") == folder
    assert resolve_model("./my-model/") == folder
    assert resolve_model("~/my-model") == folder
    assert resolve_dataset("my-model/data.jsonl") == data_file


def test_an_existing_local_folder_shadows_the_hub_repo_of_the_same_name(tmp_path, monkeypatch):
    (tmp_path / "Qwen" / "Qwen3-0.6B").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert resolve_model("Qwen/Qwen3-0.6B") == tmp_path / "Qwen" / "Qwen3-0.6B"


@pytest.mark.parametrize(
    "missing", ["/no/such/folder", "./missing-model", "~/missing-model", "./nope", "./org/name"]
)
def test_a_missing_local_path_is_a_file_not_found_error(missing):
    with pytest.raises(FileNotFoundError, match="no file or folder at") as info:
        resolve_model(missing)
    assert "bundled://tiny-qwen3" in str(info.value)


def test_a_bundled_name_written_as_a_path_suggests_the_bundled_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="did you mean 'bundled://gsm8k'"):
        resolve_dataset("gsm8k")


def test_a_revision_on_a_local_path_is_refused(tmp_path):
    with pytest.raises(ValueError, match="local path; a revision applies to hub ids only"):
        resolve_model(tmp_path, revision="main")


# Id grammar


@pytest.mark.parametrize(
    ("source", "revision", "expected"),
    [
        ("hf://org/name", None, HubId("hf", "org/name", None)),
        ("ms://org/name@v1.0", None, HubId("ms", "org/name", "v1.0")),
        ("HF://org/name", "dev", HubId("hf", "org/name", "dev")),
        ("hf://org/name@dev", "dev", HubId("hf", "org/name", "dev")),
        ("org/name@refs/pr/1", None, HubId("ms", "org/name", "refs/pr/1", bare=True)),
        ("bundled://gsm8k", None, BundledId("gsm8k")),
    ],
)
def test_ids_parse_into_hub_repo_and_revision(source, revision, expected):
    assert parse_id(source, revision) == expected


def test_a_local_path_parses_to_its_resolved_folder(tmp_path):
    assert parse_id(str(tmp_path)) == LocalId(tmp_path.resolve())


def test_two_different_revisions_are_refused():
    with pytest.raises(ValueError, match="names revision 'v1' but revision='v2'"):
        parse_id("hf://org/name@v1", revision="v2")


@pytest.mark.parametrize(
    "source", ["hf://just-a-name", "ms://org/name/extra", "hf://org/na me", "ms://org/name@"]
)
def test_malformed_hub_ids_are_refused(source):
    with pytest.raises(ValueError, match="org/name|empty revision"):
        resolve_model(source)


def test_an_unknown_prefix_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown id prefix 's3://'.*ms://, hf://, bundled://"):
        resolve_model("s3://bucket/model")


@pytest.mark.parametrize("bad", [123, None, "", "   "])
def test_non_string_or_empty_ids_are_type_errors(bad):
    with pytest.raises(TypeError, match="non-empty str or path"):
        resolve_model(bad)


def test_the_default_hub_is_modelscope_and_the_env_var_chooses_another(monkeypatch):
    assert default_hub() == "ms"
    assert parse_id("org/name").hub == "ms"
    monkeypatch.setenv("TWINKLE_DEFAULT_HUB", "hf")
    assert parse_id("org/name").hub == "hf"
    monkeypatch.setenv("TWINKLE_DEFAULT_HUB", "MS")
    assert parse_id("org/name").hub == "ms"
    monkeypatch.setenv("TWINKLE_DEFAULT_HUB", "s3")
    with pytest.raises(ValueError, match="TWINKLE_DEFAULT_HUB='s3'.*ms, hf"):
        parse_id("org/name")


# Hugging Face cache


def test_hf_model_snapshot_is_found_in_the_cache_offline(tmp_path):
    snapshot = hf_snapshot(tmp_path / "hf", "model", "org/tiny")
    assert resolve_model("hf://org/tiny") == snapshot
    assert resolve_model("hf://org/tiny", revision=COMMIT) == snapshot


def test_hf_dataset_snapshot_and_a_tagged_revision_are_found_offline(tmp_path):
    snapshot = hf_snapshot(tmp_path / "hf", "dataset", "org/data", ref="v2")
    assert resolve_dataset("hf://org/data@v2") == snapshot
    with pytest.raises(HubError):
        resolve_dataset("hf://org/data@v3")
    with pytest.raises(HubError):
        resolve_model("hf://org/data@v2")


def test_a_bare_id_uses_hf_when_the_env_var_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("TWINKLE_DEFAULT_HUB", "hf")
    snapshot = hf_snapshot(tmp_path / "hf", "model", "org/tiny")
    assert resolve_model("org/tiny") == snapshot


def test_a_cached_hf_snapshot_never_touches_the_network_even_online(tmp_path, monkeypatch):
    go_online(monkeypatch)
    snapshot = hf_snapshot(tmp_path / "hf", "model", "org/tiny")
    assert resolve_model("hf://org/tiny") == snapshot


def test_hf_offline_without_a_cached_copy_names_the_id_hub_and_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("TWINKLE_HUB_OFFLINE")
    with pytest.raises(HubError) as info:
        resolve_model("hf://org/absent")
    message = str(info.value)
    assert "'hf://org/absent'" in message and "Hugging Face" in message
    assert "HF_HUB_OFFLINE=1" in message
    assert "pass its folder instead of the id" in message
    assert f"HF_HUB_CACHE={tmp_path / 'hf'}" in message


def test_an_unreachable_hf_hub_fails_fast_naming_the_id(monkeypatch):
    go_online(monkeypatch)
    start = time.perf_counter()
    with pytest.raises(HubError, match=r"cannot get dataset 'hf://org/absent@v1'.*download failed"):
        resolve_dataset("hf://org/absent@v1")
    assert time.perf_counter() - start < 5


# ModelScope cache


@pytest.fixture(scope="module")
def modelscope_imported():
    """Import modelscope once (about 3 s) so that timing assertions measure resolution only."""
    import modelscope.hub.snapshot_download  # noqa: F401


def test_ms_model_snapshot_is_found_in_the_cache_offline(tmp_path, modelscope_imported):
    snapshot = ms_snapshot(tmp_path / "ms", "model", "org/tiny")
    assert resolve_model("ms://org/tiny") == snapshot
    assert resolve_model("org/tiny") == snapshot


def test_ms_dataset_snapshot_at_a_revision_is_found_offline(tmp_path, modelscope_imported):
    snapshot = ms_snapshot(tmp_path / "ms", "dataset", "swift/self-cognition", revision="v1")
    assert resolve_dataset("ms://swift/self-cognition@v1") == snapshot
    with pytest.raises(HubError):
        resolve_dataset("ms://swift/self-cognition@v2")


def test_a_cached_ms_snapshot_never_touches_the_network_even_online(
    tmp_path, monkeypatch, modelscope_imported
):
    go_online(monkeypatch)
    snapshot = ms_snapshot(tmp_path / "ms", "model", "org/tiny")
    start = time.perf_counter()
    assert resolve_model("ms://org/tiny") == snapshot
    assert time.perf_counter() - start < 1


def test_ms_offline_without_a_cached_copy_names_the_id_hub_and_fix(tmp_path, modelscope_imported):
    with pytest.raises(HubError) as info:
        resolve_model("org/absent")
    message = str(info.value)
    assert "'ms://org/absent'" in message and "ModelScope" in message
    assert "no local file or folder 'org/absent' exists" in message
    assert "TWINKLE_HUB_OFFLINE=1" in message
    assert f"MODELSCOPE_CACHE={tmp_path / 'ms'}" in message


def test_ms_ids_without_modelscope_installed_say_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "modelscope.hub.snapshot_download", None)
    with pytest.raises(ImportError, match=r"pip install twinkle-data\[modelscope\]"):
        resolve_model("ms://org/tiny")
