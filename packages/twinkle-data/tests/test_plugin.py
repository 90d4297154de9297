"""Plugins: components from a hub repo or a folder, loaded only with consent and a matching
hash, and resolved by every registry through one function.

Hub repos are local mirrors of each hub's cache layout (offline, as in test_hub.py); each
test uses its own repo name or folder, because a process holds one version of a plugin.
A plugin's module appends to the file ``PLUGIN_RAN`` names when it runs, so a test can
tell whether any of its code ran.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import twinkle
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.hub import Plugin, PluginError
from twinkle.hub.plugin import plugin_sha256
from twinkle.preprocessor import FILTERS, PREPROCESSORS
from twinkle.template import build_template
from twinkle.template.registry import TEMPLATES
from twinkle.utils import Registry

COMMIT = "89abcdef0123456789abcdef0123456789abcdef"
PLUGIN = '''
import os
from pathlib import Path

from twinkle.preprocessor import Filter, Preprocessor
from twinkle.template import Template

Path(os.environ["PLUGIN_RAN"]).open("a").write("ran\\n")


class ShoutProcessor(Preprocessor):
    """Self-cognition rows as a shouted exchange."""

    def __init__(self, mark="!"):
        self.mark = mark

    def __call__(self, row):
        return {"messages": [
            {"role": "user", "content": row["query"].upper() + self.mark},
            {"role": "assistant", "content": row["response"]},
        ]}


class EnglishOnly(Filter):
    def __call__(self, row):
        return row["tag"] == "en"


class PlainTemplate(Template):
    """The model's own chat template, under a plugin's name."""
'''
COMPONENTS = ["ShoutProcessor", "EnglishOnly", "PlainTemplate"]


def write_plugin(folder: Path, source: str = PLUGIN, components=COMPONENTS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "shout.py").write_text(source)
    manifest = {"module": "shout.py", "components": components}
    (folder / "twinkle_plugin.json").write_text(json.dumps(manifest))
    return folder


def hf_plugin(tmp_path: Path, repo_id: str, source: str = PLUGIN, components=COMPONENTS) -> Path:
    """A plugin repo in the Hugging Face cache layout (refs/main -> snapshots/<commit>)."""
    repo = tmp_path / "hf" / f"models--{repo_id.replace('/', '--')}"
    write_plugin(repo / "snapshots" / COMMIT, source, components)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return repo / "snapshots" / COMMIT


@pytest.fixture(autouse=True)
def offline_hubs(monkeypatch, tmp_path):
    monkeypatch.setenv("TWINKLE_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "ms"))
    monkeypatch.delenv("TWINKLE_TRUST_REMOTE_CODE", raising=False)
    monkeypatch.setenv("PLUGIN_RAN", str(tmp_path / "ran.txt"))


def runs(tmp_path: Path) -> int:
    marker = tmp_path / "ran.txt"
    return marker.read_text().count("ran") if marker.exists() else 0


# Loading


def test_a_local_folder_loads_without_consent_and_names_its_components(tmp_path):
    folder = write_plugin(tmp_path / "shout")
    loaded = Plugin.load_plugin(folder)
    assert sorted(loaded) == [f"{folder}:{name}" for name in sorted(COMPONENTS)]
    row = {"query": "who are you", "response": "a model"}
    assert loaded[f"{folder}:ShoutProcessor"]()(row)["messages"][0]["content"] == "WHO ARE YOU!"
    assert Plugin.load_plugin(str(folder)) == loaded  # held once per process
    assert runs(tmp_path) == 1


def test_a_hub_plugin_runs_no_code_without_consent_and_says_how_to_give_it(tmp_path):
    snapshot = hf_plugin(tmp_path, "org/untrusted")
    with pytest.raises(PluginError) as info:
        Plugin.load_plugin("hf://org/untrusted")
    message = str(info.value)
    assert "hf://org/untrusted at revision " + COMMIT in message
    assert "trust_remote_code=True" in message and "TWINKLE_TRUST_REMOTE_CODE=1" in message
    assert f"sha256='{plugin_sha256(snapshot)}'" in message
    assert (
        "ShoutProcessor, EnglishOnly, PlainTemplate" in message
    )  # what it provides, from the manifest
    with pytest.raises(PluginError, match="only with consent"):
        Plugin.load_plugin("hf://org/untrusted", trust_remote_code=False)
    assert runs(tmp_path) == 0


def test_consent_loads_the_cached_snapshot_and_logs_its_revision_and_hash(tmp_path, caplog):
    snapshot = hf_plugin(tmp_path, "org/trusted")
    with caplog.at_level(logging.INFO):
        loaded = Plugin.load_plugin("hf://org/trusted", trust_remote_code=True)
    assert set(loaded) == {f"hf://org/trusted:{name}" for name in COMPONENTS}
    assert f"at revision {COMMIT} (sha256={plugin_sha256(snapshot)})" in caplog.text
    # Imported from a private copy: the cache snapshot gets no bytecode, its hash holds.
    module_file = Path(sys.modules[loaded["hf://org/trusted:EnglishOnly"].__module__].__file__)
    assert not module_file.is_relative_to(tmp_path) and not (snapshot / "__pycache__").exists()


def test_the_environment_gives_consent_and_a_revision_pins_the_snapshot(tmp_path, monkeypatch):
    hf_plugin(tmp_path, "org/by-env")
    monkeypatch.setenv("TWINKLE_TRUST_REMOTE_CODE", "1")
    loaded = Plugin.load_plugin("hf://org/by-env", revision=COMMIT)
    assert "hf://org/by-env:ShoutProcessor" in loaded
    with pytest.raises(PluginError, match="cannot load plugin 'hf://org/by-env@v9'"):
        Plugin.load_plugin("hf://org/by-env@v9")  # not in the cache


def test_a_modelscope_cache_snapshot_loads_too(tmp_path):
    snapshot = tmp_path / "ms" / "models" / "org--ms-plugin" / "snapshots" / "v1"
    write_plugin(snapshot)
    loaded = Plugin.load_plugin("ms://org/ms-plugin@v1", trust_remote_code=True)
    assert "ms://org/ms-plugin:EnglishOnly" in loaded


# Hashes


def test_the_hash_is_the_sha256sum_listing_an_operator_computes_by_hand(tmp_path):
    folder = write_plugin(tmp_path / "hashed")
    (folder / "data").mkdir()
    (folder / "data" / "words.txt").write_text("one\ntwo\n")
    shell = (
        "find . -type f ! -path './.git/*' -printf '%P\\0' | LC_ALL=C sort -z "
        "| xargs -0 sha256sum | sha256sum"
    )
    by_hand = subprocess.run(shell, shell=True, cwd=folder, capture_output=True, text=True)
    assert plugin_sha256(folder) == by_hand.stdout.split()[0]
    (folder / ".git").mkdir()
    (folder / ".git" / "HEAD").write_text("ref: refs/heads/main\n")  # not part of the repo
    assert plugin_sha256(folder) == by_hand.stdout.split()[0]
    (folder / "data" / "words.txt").write_text("one\nthree\n")
    assert plugin_sha256(folder) != by_hand.stdout.split()[0]


def test_a_pinned_hash_loads_and_a_wrong_one_is_refused_before_any_code_runs(tmp_path):
    snapshot = hf_plugin(tmp_path, "org/pinned")
    good = plugin_sha256(snapshot)
    with pytest.raises(PluginError, match=f"hash to sha256={good}, not the pinned sha256=0+"):
        Plugin.load_plugin("hf://org/pinned", sha256="0" * 64, trust_remote_code=True)
    assert runs(tmp_path) == 0
    assert Plugin.load_plugin("hf://org/pinned", sha256=good.upper(), trust_remote_code=True)
    with pytest.raises(PluginError, match="sha256= must be the 64 hex digits"):
        Plugin.load_plugin("hf://org/pinned", sha256="abc", trust_remote_code=True)


def test_a_plugin_whose_files_changed_after_loading_is_refused(tmp_path):
    folder = write_plugin(tmp_path / "changing")
    first = Plugin.load_plugin(folder)
    (folder / "shout.py").write_text(PLUGIN + "\nEXTRA = 1\n")
    with pytest.raises(PluginError, match="already runs it with sha256=.*a changed plugin"):
        Plugin.load_plugin(folder)
    assert PREPROCESSORS.get(f"{folder}:ShoutProcessor") is first[f"{folder}:ShoutProcessor"]


# Names in registries


def test_every_registry_resolves_plugin_names_and_dataset_map_uses_them(tmp_path):
    folder = write_plugin(tmp_path / "named")
    dataset = Dataset(DatasetMeta("bundled://self-cognition", data_slice=range(8)))
    dataset.filter(f"{folder}:EnglishOnly")
    dataset.map(f"{folder}:ShoutProcessor", init_args={"mark": "?"})
    rows = list(dataset)
    assert rows and all(row["messages"][0]["content"].endswith("?") for row in rows)
    assert all(
        row["messages"][0]["content"] == row["messages"][0]["content"].upper() for row in rows
    )
    assert FILTERS.get(f"{folder}:EnglishOnly").__name__ == "EnglishOnly"
    template = build_template(f"{folder}:PlainTemplate", model_id="bundled://tiny-qwen3")
    assert type(template).__name__ == "PlainTemplate"
    dataset.set_template(f"{folder}:PlainTemplate", model_id="bundled://tiny-qwen3")
    dataset.encode()
    assert len(dataset[0]["input_ids"]) > 0


def test_a_hub_name_loads_its_plugin_on_first_use_with_consent_from_the_environment(
    tmp_path, monkeypatch
):
    hf_plugin(tmp_path, "org/lazy")
    with pytest.raises(PluginError, match="only with consent"):
        PREPROCESSORS.get("hf://org/lazy:ShoutProcessor")
    monkeypatch.setenv("TWINKLE_TRUST_REMOTE_CODE", "true")
    assert PREPROCESSORS.get("hf://org/lazy:ShoutProcessor").__name__ == "ShoutProcessor"


def test_a_class_the_repo_does_not_declare_lists_what_it_provides_without_running_it(tmp_path):
    hf_plugin(tmp_path, "org/listing")
    with pytest.raises(ValueError, match=r"unknown preprocessor 'hf://org/listing:Nope'") as info:
        PREPROCESSORS.get("hf://org/listing:Nope")
    assert "hf://org/listing provides ShoutProcessor, EnglishOnly, PlainTemplate" in str(info.value)
    assert runs(tmp_path) == 0


def test_a_component_of_the_wrong_kind_names_what_it_is_and_what_is_wanted(tmp_path):
    folder = write_plugin(tmp_path / "kinds")
    with pytest.raises(TypeError) as info:
        TEMPLATES.get(f"{folder}:ShoutProcessor")
    message = str(info.value)
    assert "is not a template: ShoutProcessor subclasses Preprocessor" in message
    assert "must subclass Template" in message and "template components: PlainTemplate" in message
    with pytest.raises(TypeError, match="filter components: EnglishOnly"):
        FILTERS.get(f"{folder}:ShoutProcessor")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("hf://org/repo", "names a repo but no class: write hf://org/repo:ClassName"),
        ("hf://org/repo:1st", "a plugin component is written source:ClassName"),
        (":ShoutProcessor", "a plugin component is written source:ClassName"),
    ],
)
def test_malformed_plugin_names_show_the_form(name, message):
    with pytest.raises(ValueError, match=message):
        PREPROCESSORS.get(name)


def test_registered_names_cannot_look_like_plugin_names():
    registry = Registry("widget")
    with pytest.raises(ValueError, match="':', which marks a plugin component"):
        registry.register(type("Widget", (), {}), name="org:Widget")


def test_twinkle_plugin_is_the_hub_plugin_loader():
    assert twinkle.Plugin is Plugin


# Bad repos: each error names the repo and the cause, and leaves nothing registered


def test_a_repo_that_does_not_exist_names_the_repo_and_the_cause(tmp_path):
    with pytest.raises(PluginError, match="cannot load plugin 'hf://org/absent'.*offline"):
        Plugin.load_plugin("hf://org/absent", trust_remote_code=True)
    with pytest.raises(FileNotFoundError, match="no file or folder"):
        Plugin.load_plugin(tmp_path / "nowhere")


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        (None, "is not a Twinkle plugin: it has no twinkle_plugin.json"),
        ("{not json", "is not valid JSON"),
        ({"module": "shout.py"}, "exactly the keys 'module' and 'components'"),
        ({"module": "../shout.py", "components": ["A"]}, "must stay inside the repo"),
        ({"module": "gone.py", "components": ["A"]}, "neither a .py file nor a folder"),
        ({"module": "shout.py", "components": []}, "non-empty list"),
        ({"module": "shout.py", "components": ["A", "A"]}, "lists a name twice"),
        ({"module": "shout.py", "components": ["a-b"]}, "non-class names"),
    ],
)
def test_a_bad_manifest_is_refused_naming_the_repo(tmp_path, manifest, message):
    folder = write_plugin(tmp_path / "bad")
    target = folder / "twinkle_plugin.json"
    if manifest is None:
        target.unlink()
    else:
        target.write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    with pytest.raises(PluginError, match=message) as info:
        Plugin.load_plugin(folder)
    assert str(folder) in str(info.value)
    assert runs(tmp_path) == 0


@pytest.mark.parametrize(
    ("source", "components", "message"),
    [
        (PLUGIN + "\nraise RuntimeError('boom')\n", COMPONENTS, "RuntimeError: boom"),
        ("import not_a_module_anywhere\n", COMPONENTS, "ModuleNotFoundError"),
        (PLUGIN, [*COMPONENTS, "Missing"], "declares 'Missing', but .* defines no Missing"),
        (
            PLUGIN + "\nshout = 3\n",
            [*COMPONENTS, "shout"],
            "in shout.py it is a int value, not a class",
        ),
    ],
)
def test_a_plugin_that_fails_to_import_leaves_nothing_half_registered(
    tmp_path, source, components, message
):
    folder = write_plugin(tmp_path / "broken", source, components)
    modules = set(sys.modules)
    with pytest.raises(PluginError, match=message) as info:
        Plugin.load_plugin(folder)
    assert str(folder) in str(info.value) and "shout.py" in str(info.value)
    assert not [m for m in set(sys.modules) - modules if m.startswith("_twinkle_plugin_")]
    with pytest.raises(PluginError):  # still not held: the name fails the same way
        PREPROCESSORS.get(f"{folder}:ShoutProcessor")
    write_plugin(folder)  # fixed: it now loads, as if never tried
    assert f"{folder}:ShoutProcessor" in Plugin.load_plugin(folder)


def test_a_plugin_package_imports_its_own_modules_relatively(tmp_path):
    folder = tmp_path / "pkg-plugin"
    (folder / "shoutpkg").mkdir(parents=True)
    (folder / "shoutpkg" / "__init__.py").write_text("from .impl import ShoutProcessor\n")
    (folder / "shoutpkg" / "impl.py").write_text(PLUGIN)
    manifest = {"module": "shoutpkg", "components": ["ShoutProcessor"]}
    (folder / "twinkle_plugin.json").write_text(json.dumps(manifest))
    assert f"{folder}:ShoutProcessor" in Plugin.load_plugin(folder)
    absolute = shutil.copytree(folder, tmp_path / "absolute-plugin")
    (absolute / "shoutpkg" / "__init__.py").write_text("from shoutpkg.impl import ShoutProcessor\n")
    with pytest.raises(PluginError, match="imports its own modules relatively"):
        Plugin.load_plugin(absolute)
