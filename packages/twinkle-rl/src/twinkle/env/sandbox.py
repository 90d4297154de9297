"""Run untrusted Python in a subprocess with time, memory and output limits and no network.

The program runs in a fresh interpreter started with ``-I -S`` (no site-packages, no user
paths: the standard library only), in an empty temporary folder, with an environment of
its own. Before the program's first line, the child sets its own resource limits (address
space, CPU seconds, file size, no core dumps) and installs an audit hook, which Python
code cannot remove, refusing sockets, new processes and ``ctypes``. Where unprivileged
user namespaces are available (``unshare -rn`` works), the child also runs in a network
namespace of its own with no interfaces. The parent kills the whole process group at the
wall-clock limit.

What this is not: a security boundary against a determined attacker (use a container or a
VM for that); it keeps an RL policy's programs from hanging the run, eating the machine's
memory or reaching the network.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Limit = Literal["time", "memory", "cpu", "output"]

_BOOTSTRAP = r"""
import resource, sys
memory, cpu, fsize = (int(v) for v in sys.argv[1:4])
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
source = sys.stdin.read()
_BLOCKED = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.fork",
            "os.forkpty", "pty.", "ctypes.")
def _refuse(event, args):
    if event.startswith(_BLOCKED):
        raise PermissionError(f"the sandbox does not allow {event}")
sys.addaudithook(_refuse)
del resource
namespace = {"__name__": "__main__", "__builtins__": __builtins__}
exec(compile(source, "<program>", "exec"), namespace)
"""


@dataclass(frozen=True)
class SandboxResult:
    """What a program did: its exit code (None when it was killed), its output (cut to
    the output limit) and which limit stopped it, if any."""

    returncode: int | None
    stdout: str
    stderr: str
    limit: Limit | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.limit is None

    def report(self) -> str:
        """The result as the model reads it: output, then what went wrong."""
        if self.limit == "time":
            return f"{self.stdout}error: the program ran past its time limit and was killed"
        if self.limit == "cpu":
            return f"{self.stdout}error: the program used up its CPU time limit and was killed"
        if self.limit == "memory":
            return f"{self.stdout}error: the program exceeded its memory limit"
        if self.returncode != 0:
            last = self.stderr.strip().splitlines()[-1:] or [f"exit code {self.returncode}"]
            return f"{self.stdout}error: {last[0]}"
        return self.stdout if self.limit is None else f"{self.stdout}\n[output cut]"


@functools.cache
def network_namespace_available() -> bool:
    """Whether ``unshare -rn`` can give the child a network namespace of its own."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    try:
        return (
            subprocess.run([unshare, "-rn", "true"], capture_output=True, timeout=10).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
        return False


def run_python(
    code: str,
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 256,
    max_output_chars: int = 4000,
) -> SandboxResult:
    """Run ``code`` (see the module docstring); never raises for what the program does."""
    if timeout_s <= 0 or memory_mb <= 0 or max_output_chars <= 0:
        raise ValueError(
            f"timeout_s, memory_mb and max_output_chars must be positive, got {timeout_s}, "
            f"{memory_mb}, {max_output_chars}"
        )
    # A backstop above the wall clock: one thread's CPU time cannot reach it before the
    # wall-clock kill (which reports "time"); threads burning CPU faster than that can.
    cpu_s = int(timeout_s) + 2
    limits = [str(memory_mb * 2**20), str(cpu_s), str(16 * 2**20)]
    command = [sys.executable, "-I", "-S", "-c", _BOOTSTRAP, *limits]
    if network_namespace_available():
        command = [shutil.which("unshare") or "unshare", "-rn", *command]
    # Output goes to files in the program's folder, where the file-size limit caps it (a
    # pipe would let a printing loop fill the parent's memory).
    with tempfile.TemporaryDirectory(prefix="twinkle-sandbox-") as folder:
        out_path, err_path = Path(folder, ".stdout"), Path(folder, ".stderr")
        with out_path.open("wb") as out, err_path.open("wb") as err:
            process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                cwd=folder,
                env={"PATH": "/usr/bin:/bin", "HOME": folder, "PYTHONIOENCODING": "utf-8"},
                start_new_session=True,
            )
            timed_out = False
            try:
                process.communicate(code.encode("utf-8", "replace"), timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(process)
                process.wait()
        stdout = _read_head(out_path, max_output_chars + 1)
        stderr = _read_head(err_path, 64 * 1024)
    if timed_out:
        return SandboxResult(None, stdout[:max_output_chars], stderr[-max_output_chars:], "time")
    return _result(process.returncode, stdout, stderr, max_output_chars)


def _read_head(path: Path, chars: int) -> str:
    with path.open("rb") as file:
        return file.read(chars * 4).decode("utf-8", "replace")[:chars]


def _kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def _result(returncode: int, stdout: str, stderr: str, max_chars: int) -> SandboxResult:
    limit: Limit | None = None
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL) and "MemoryError" not in stderr:
        limit = "cpu"
    elif "MemoryError" in stderr:
        limit = "memory"
    elif len(stdout) > max_chars:
        limit = "output"
    code = None if returncode < 0 else returncode
    return SandboxResult(code, stdout[:max_chars], stderr[-max_chars:], limit)
