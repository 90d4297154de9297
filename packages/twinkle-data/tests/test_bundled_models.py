"""The bundled tiny model folders are what their build scripts make, byte for byte, and
each loads as its family's tokenizer and model config."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from transformers import AutoConfig, AutoTokenizer

from twinkle.hub import resolve_model
from twinkle.hub.bundled import bundled_names

SCRIPTS = Path(__file__).parents[1] / "scripts"


@pytest.fixture(scope="module")
def scripts():
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(SCRIPTS))
        yield (
            importlib.import_module("build_tiny_qwen3"),
            importlib.import_module("build_tiny_families"),
        )


def same_files(built: Path, committed: Path) -> None:
    names = sorted(p.name for p in built.iterdir())
    assert names == sorted(p.name for p in committed.iterdir()), committed.name
    for name in names:
        assert (built / name).read_bytes() == (committed / name).read_bytes(), (committed, name)


def test_the_build_scripts_reproduce_every_bundled_model(scripts, tmp_path):
    qwen3, families = scripts
    qwen3.build(tmp_path / "tiny-qwen3")
    families.build(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == bundled_names("model")
    for folder in tmp_path.iterdir():
        same_files(folder, resolve_model(f"bundled://{folder.name}"))


@pytest.mark.parametrize("name", bundled_names("model"))
def test_each_folder_is_its_familys_tokenizer_and_config(name):
    folder = resolve_model(f"bundled://{name}")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    config = AutoConfig.from_pretrained(folder)
    assert config.vocab_size == len(tokenizer)
    assert config.eos_token_id == tokenizer.eos_token_id
    # Only the Qwen3 format keeps generation blocks; the rest are as models ship them.
    has_blocks = "{%- generation %}" in tokenizer.chat_template
    assert has_blocks == (name in ("tiny-qwen3", "tiny-qwen3-moe"))
