"""The ``twinkle`` command: runs the main job, ``cookbook/quickstart.py``, with its flags.

    twinkle                                   # the bundled tiny model, about a minute on a CPU
    twinkle --model-id ms://Qwen/Qwen3-4B --dataset-id ms://swift/self-cognition

The cookbook script is the one source of the job, so what a reader sees in
``cookbook/quickstart.py`` is exactly what the command runs. A wheel carries it as
``twinkle/quickstart_job.py`` (the build copies it in); a source checkout runs
the cookbook file itself.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

PACKAGED = Path(__file__).with_name("quickstart_job.py")
# packages/twinkle-rl/src/twinkle/cli.py -> the repository root holding cookbook/
CHECKOUT = Path(__file__).resolve().parents[4] / "cookbook" / "quickstart.py"


def job_path() -> Path:
    """Where the main job's script is: the wheel's copy, else the source checkout's."""
    for path in (PACKAGED, CHECKOUT):
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"the main job's script is missing: neither {PACKAGED} (a wheel's copy) nor {CHECKOUT} "
        "(a source checkout) exists; reinstall twinkle-rl"
    )


def main(argv: list[str] | None = None) -> None:
    """Run the main job as ``python cookbook/quickstart.py`` would, with ``argv`` as its flags."""
    # Not run as __main__: the job's own entry guard stays quiet and main gets this prog name.
    job = runpy.run_path(str(job_path()), run_name="twinkle_main_job")
    job["main"](sys.argv[1:] if argv is None else argv, prog="twinkle")


if __name__ == "__main__":
    main()
