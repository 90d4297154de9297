"""The proof that distillation learns: a shortened run of cookbook/rl/distil_arithmetic.py.

A teacher 2.9x the student's size is taught the arithmetic task (60 SFT steps), then 10
on-policy GKD steps (beta 0.5) bring the untrained student's KL(student || teacher) on the
held-out prompts' answers down by more than a fifth (measured, seed 0: 8.13 -> 5.22).
"""

import importlib.util
from pathlib import Path

COOKBOOK = Path(__file__).resolve().parents[3] / "cookbook" / "rl"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, COOKBOOK / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gkd_lowers_the_held_out_kl_to_the_teacher():
    curve = load("distil_arithmetic").main(["--teacher-steps", "60", "--steps", "10"])[
        "held_out_kl"
    ]
    assert curve[-1] < 0.8 * curve[0], curve
    assert curve[1] < curve[0], curve
