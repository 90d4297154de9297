"""The run-modes page's single-card sample runs as written (ids aside): no map, no
set_optimizer. As the cookbook script on the bundled self-cognition set, and with the same
code on a small dataset in each common raw shape, system fields included."""

import json
import math
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

from twinkle.model import TransformersModel

SAMPLE = Path(__file__).resolve().parents[3] / "cookbook" / "run_modes_single_card.py"
DATASET_ID = '"bundled://self-cognition"'
ROWS = 16  # two batches of 8


def sample_code() -> str:
    code = SAMPLE.read_text().split('"""', 2)[2]  # after the docstring
    assert "ms://" not in code and DATASET_ID in code and "bundled://tiny-qwen3" in code
    assert ".map(" not in code and "set_optimizer" not in code, "the page calls neither"
    return code


def test_the_sample_runs_on_the_bundled_self_cognition_set(tmp_path, child_env):
    done = subprocess.run(
        [sys.executable, str(SAMPLE)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=child_env(HF_DATASETS_CACHE=str(tmp_path / "hf")),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    err = done.stderr
    assert "AutoPreprocessor converts its raw rows" in err
    assert "of the first 100 rows: 100 query_response." in err
    assert "holds the self-cognition placeholders {{NAME}}/{{AUTHOR}}" in err
    assert err.count("has no optimizer") == 1
    assert "the full model has no optimizer, so it gets the default AdamW(lr=1e-05)" in err


SHAPES = {
    "query_response": lambda i: {
        "system": "You are Twinkle.",
        "history": [["Hello", "Hi there."]],
        "query": f"Who are you? ({i})",
        "response": "I am Twinkle.",
    },
    "alpaca": lambda i: {
        "system": "You are Twinkle.",
        "instruction": f"Introduce yourself ({i}).",
        "input": "Briefly." if i % 2 else "",
        "output": "I am Twinkle.",
    },
    "messages": lambda i: {
        "messages": [
            {"role": "system", "content": "You are Twinkle."},
            {"role": "user", "content": f"Who are you? ({i})"},
            {"role": "assistant", "content": "I am Twinkle."},
        ]
    },
    "sharegpt": lambda i: {
        "system": "You are Twinkle.",
        "conversations": [
            {"from": "human", "value": f"Who are you? ({i})"},
            {"from": "gpt", "value": "I am Twinkle."},
        ],
    },
}


@pytest.fixture(scope="module", autouse=True)
def datasets_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf")))
        yield


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_sample_runs_on_raw_rows_of_each_shape(shape, tmp_path, monkeypatch, capsys):
    path = tmp_path / f"{shape}.jsonl"
    path.write_text("".join(json.dumps(SHAPES[shape](i)) + "\n" for i in range(ROWS)))
    norms = []
    step = TransformersModel.clip_grad_and_step

    def recording(self, *args, **kwargs):
        norms.append(step(self, *args, **kwargs))
        return norms[-1]

    monkeypatch.setattr(TransformersModel, "clip_grad_and_step", recording)
    code = sample_code().replace(DATASET_ID, json.dumps(str(path)))
    exec(compile(code, str(SAMPLE), "exec"), {"__name__": "__main__"})
    assert len(norms) == ROWS // 8
    assert all(norm is not None and math.isfinite(norm) and norm > 0 for norm in norms), norms
    err = capsys.readouterr().err
    assert f"of the first {ROWS} rows: {ROWS} {shape}." in err
    assert err.count("the full model has no optimizer") == 1
    assert "placeholders" not in err
