"""Sessions of the Twinkle workspace: one per distribution, plus lint, layering, wheels, benches.

Every session installs from the committed ``uv.lock`` (``--frozen``), so CI tests
exactly the versions a developer locked. ``nox`` runs the default sessions;
``nox -s mesh`` runs one package alone (a CI matrix can fan out over them).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv"
nox.options.error_on_missing_interpreters = True

ROOT = Path(__file__).parent
PACKAGES = ["mesh", "data", "kernels", "models", "rl", "server", "client", "kit"]
# Extras a package's own tests need beyond its dependencies and its "test" group.
TEST_EXTRAS = {
    "mesh": ["torch", "ray", "tensorboard", "wandb", "mlflow", "swanlab", "plot"],
    "data": ["modelscope"],
    "models": ["ray", "megatron"],
    "rl": ["ray"],
    "kit": ["client", "megatron"],
}
# Suites that run on two pytest workers (a module's tests on one, so its fixtures are built
# once): they spend about half their time waiting on servers, Ray clusters and child
# processes. On 2 cores two workers cut kit 556 -> 302 s, server 192 -> 151 s, rl 252 ->
# 221 s and mesh 84 -> 63 s. The others stay on one: models' torchrun launches already use
# both cores (two workers: 800 -> 1116 s), and data, kernels and client are over before a
# second worker pays for its start (32 -> 35 s, 14 -> 24 s, 20 -> 26 s).
TWO_WORKER_SUITES = {"mesh", "rl", "server", "kit"}
TWO_WORKERS = ("-n", "2", "--dist", "loadfile")
# The uv that came with nox, so sessions work where pip's scripts folder is not on PATH.
UV = (sys.executable, "-m", "uv")
# These machines set PYTHONDONTWRITEBYTECODE, so every process (each torchrun rank) would
# recompile torch's imports: seconds each. An empty value lets Python cache bytecode again,
# lazily, for the modules a session really imports.
BYTECODE_ENV = {"PYTHONDONTWRITEBYTECODE": ""}
# Extras that install only on a GPU machine (vLLM pins its own torch; fla breaks CPU imports).
GPU_ONLY_EXTRAS = ("--no-extra=vllm", "--no-extra=fla")
# Each package session's test time, printed by the last default session (suite-times).
SUITE_TIMES = ROOT / ".nox" / "suite-times.json"


def uv_sync(session: nox.Session, *args: str) -> None:
    """Install the locked workspace selection into this session's venv."""
    session.env.update(BYTECODE_ENV)
    env = {"UV_PROJECT_ENVIRONMENT": session.virtualenv.location}
    session.run_install(
        *UV, "sync", "--frozen", "--no-default-groups", *args, env=env, external=True
    )


def package_session(short: str):
    def run(session: nox.Session) -> None:
        extras = [f"--extra={e}" for e in TEST_EXTRAS.get(short, [])]
        selection = ["--all-packages"] if short == "kit" else [f"--package=twinkle-{short}"]
        workers = TWO_WORKERS if short in TWO_WORKER_SUITES else ()
        xdist = ("--group=fast",) if short in TWO_WORKER_SUITES else ()
        uv_sync(session, *selection, "--group=test", *xdist, *extras)
        tests = ROOT / "packages" / f"twinkle-{short}" / "tests"
        start = time.monotonic()
        try:
            session.run("python", "-m", "pytest", str(tests), *workers, *session.posargs)
        finally:
            _record_suite_time(short, time.monotonic() - start)

    run.__doc__ = f"Tests of twinkle-{short}, in a venv with only what it declares."
    return run


def _record_suite_time(name: str, seconds: float) -> None:
    times = json.loads(SUITE_TIMES.read_text()) if SUITE_TIMES.exists() else {}
    times[name] = round(seconds, 1)
    SUITE_TIMES.parent.mkdir(parents=True, exist_ok=True)
    SUITE_TIMES.write_text(json.dumps(times, indent=1))


for _short in PACKAGES:
    nox.session(name=_short)(package_session(_short))


@nox.session(default=False)
def fast(session: nox.Session) -> None:
    """The developer's loop: every package's tests that start no process and train no
    quality bar (the root conftest's tiers), in one venv, one pytest worker per core.

    A module's tests stay on one worker (``--dist loadfile``), so its shared tiny model is
    built once; each worker computes on one thread, as the cores are already all in use.
    """
    extras = sorted({f"--extra={e}" for names in TEST_EXTRAS.values() for e in names})
    uv_sync(session, "--all-packages", "--group=test", "--group=fast", *extras)
    session.env["OMP_NUM_THREADS"] = "1"
    tests = [str(ROOT / "packages" / f"twinkle-{short}" / "tests") for short in PACKAGES]
    tier = ["-m", "not processes and not slow", "-n", "auto", "--dist", "loadfile"]
    session.run("python", "-m", "pytest", *tests, *tier, *session.posargs)


@nox.session(name="tinker-legacy")
def tinker_legacy(session: nox.Session) -> None:
    """The Tinker SL and RL flows with the old SDK (tinker==0.16.1, JSON only) on a real server."""
    uv_sync(session, "--all-packages", "--group=test", "--extra=client")
    # The lock pins the current SDK; this venv swaps the old one in over it.
    session.install("tinker==0.16.1")
    session.env["TWINKLE_EXPECT_TINKER"] = "0.16.1"
    tests = ROOT / "packages" / "twinkle-kit" / "tests" / "tinker"
    session.run("python", "-m", "pytest", str(tests / "test_legacy_sdk.py"), *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole workspace."""
    uv_sync(session, "--only-group=lint")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(venv_backend="none")
def imports(session: nox.Session) -> None:
    """The one-way dependency rule of DESIGN.md §1, checked from the import statements."""
    session.run(sys.executable, str(ROOT / "tools" / "check_imports.py"), str(ROOT))


def _build_wheels(session: nox.Session, *packages: str) -> list[str]:
    out = Path(session.create_tmp()) / "dist"
    selection = [f"--package=twinkle-{p}" for p in packages] or ["--all-packages"]
    for flag in selection:
        session.run(*UV, "build", "--wheel", "--out-dir", str(out), flag, external=True)
    return sorted(str(p) for p in out.glob("*.whl"))


def _install_wheels(session: nox.Session, wheels: list[str], package: str | None) -> None:
    """Install built wheels with third-party versions pinned by the lock."""
    pins = Path(session.create_tmp()) / "pins.txt"
    selection = [f"--package={package}"] if package else ["--all-packages"]
    # uv refuses --no-extra for an extra the selected package does not define.
    skip = () if package else GPU_ONLY_EXTRAS
    session.run(
        *UV, "export", "--quiet", "--frozen", "--no-emit-workspace", "--no-dev", "--no-hashes",
        "--all-extras", *skip, *selection, "-o", str(pins), external=True,
    )  # fmt: skip
    session.install("-r", str(pins), *wheels)


def _import_check(session: nox.Session, *flags: str) -> None:
    # Run from a temp dir so the workspace sources cannot shadow the installed wheels.
    session.chdir(session.create_tmp())
    session.run("python", str(ROOT / "tools" / "import_all.py"), str(ROOT), *flags)


@nox.session
def wheels(session: nox.Session) -> None:
    """Build every distribution, install the wheels into a fresh venv, import every subpackage."""
    built = _build_wheels(session)
    _install_wheels(session, built, None)
    _import_check(session, "--from-site-packages")


@nox.session(name="client-no-torch")
def client_no_torch(session: nox.Session) -> None:
    """twinkle-client and twinkle-mesh install and import on a laptop without torch."""
    built = _build_wheels(session, "mesh", "client")
    _install_wheels(session, built, "twinkle-client")
    _import_check(
        session, "--from-site-packages", "--only=twinkle-mesh,twinkle-client", "--no-torch"
    )


@nox.session(name="bench-mesh", default=False)
def bench_mesh(session: nox.Session) -> None:
    """Cost of a local-mode @remote_function call against a plain method call."""
    _run_benchmarks(session, "twinkle-mesh", "bench_mesh.py")


def _run_benchmarks(
    session: nox.Session, package: str, *scripts: str, extras: tuple[str, ...] = ()
) -> None:
    uv_sync(session, f"--package={package}", *(f"--extra={e}" for e in extras))
    for script in scripts:
        session.run("python", str(ROOT / "benchmarks" / script), *session.posargs)


@nox.session(name="bench-data", default=False)
def bench_data(session: nox.Session) -> None:
    """Encode throughput (the bundled format and every family's), packing efficiency and
    DataLoader resume cost."""
    _run_benchmarks(
        session,
        "twinkle-data",
        "bench_data_encode.py",
        "bench_data_families.py",
        "bench_data_packing.py",
        "bench_data_resume.py",
    )


@nox.session(name="bench-model", default=False)
def bench_model(session: nox.Session) -> None:
    """Model step overhead and memory against plain PyTorch, chunked cross-entropy memory, and
    the documents' loop (padding-free by default) against a hand-written padded loop."""
    _run_benchmarks(
        session,
        "twinkle-models",
        "bench_model_overhead.py",
        "bench_model_chunked_ce.py",
        "bench_model_packing.py",
    )


@nox.session(name="bench-parallel", default=False)
def bench_parallel(session: nox.Session) -> None:
    """Padding-free against padded tokens/s, on one process and by default under sp2 and
    cp2; FSDP2 against DDP bytes on the wire per step; tensor parallel's bytes per family and
    with dp, Ulysses and EP against theory; ring attention's bytes per step at cp2 and cp4
    against theory; the pipeline bubble and bytes of pp2 against theory."""
    _run_benchmarks(
        session,
        "twinkle-models",
        "bench_parallel_packing.py",
        "bench_parallel_sp_packing.py",
        "bench_parallel_comm.py",
        "bench_parallel_cp.py",
        "bench_parallel_pp.py",
    )


@nox.session(name="bench-ray", default=False)
def bench_ray(session: nox.Session) -> None:
    """@remote_function over Ray actors against raw actor calls; driver bytes with lazy collect."""
    _run_benchmarks(session, "twinkle-kit", "bench_ray.py", extras=("ray",))


@nox.session(name="bench-rl", default=False)
def bench_rl(session: nox.Session) -> None:
    """TorchSampler against transformers' generate; weight sync; one GRPO step by stage;
    MultiTurnRollout against a hand-written loop, async GRPO (k = 1, 2) against sync."""
    _run_benchmarks(session, "twinkle-rl", "bench_rl.py", "bench_agentic.py")


@nox.session(name="bench-server", default=False)
def bench_server(session: nox.Session) -> None:
    """Tenants batched against serial scheduling (1, 4, 8, 16 tenants, over HTTP and in
    process), 8 adapters sampled in one batch; LoRA slot churn; the OpenAI endpoint's time to
    first token and tokens/s against the sampler in process."""
    _run_benchmarks(session, "twinkle-kit", "bench_server.py", "bench_openai.py")


@nox.session(name="bench-megatron", default=False)
def bench_megatron(session: nox.Session) -> None:
    """HF to Megatron conversion time; CPU step time per layout against TransformersModel."""
    _run_benchmarks(session, "twinkle-models", "bench_megatron.py", extras=("megatron",))


@nox.session(name="bench-tinker", default=False)
def bench_tinker(session: nox.Session) -> None:
    """Tinker SDK forward_backward + optim_step round trip against the Twinkle client's steps."""
    _run_benchmarks(session, "twinkle-kit", "bench_tinker.py", extras=("client",))


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site, built with --strict: a broken link or API reference fails."""
    # The API reference is read from the sources (mkdocs.yml's paths), so no package is installed.
    uv_sync(session, "--only-group=docs")
    session.env["NO_MKDOCS_2_WARNING"] = "1"  # material's banner about its successor
    site = Path(session.create_tmp()) / "site"
    config = str(ROOT / "mkdocs.yml")
    session.run("mkdocs", "build", "--strict", "--config-file", config, "--site-dir", str(site))


@nox.session(name="suite-times", venv_backend="none")
def suite_times(session: nox.Session) -> None:
    """Print each package's test time of this run (the package sessions record them)."""
    times = json.loads(SUITE_TIMES.read_text()) if SUITE_TIMES.exists() else {}
    if not times:
        session.error("no package session recorded a test time: run the package sessions first")
    width = max(len(name) for name in times)
    for name, seconds in times.items():
        session.log(f"{name:<{width}}  {seconds:8.1f} s")
    session.log(f"{'total':<{width}}  {sum(times.values()):8.1f} s")
