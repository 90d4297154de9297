"""`pip install -e .` at the repository root, as the documents install from source.

pip reads the requirements from the root wheel that hatchling builds (with hatch_build.py), so
these tests build that wheel with hatchling's own builder, as pip's build does, from a copy of
the checkout, and read its METADATA: every workspace distribution must come from this checkout
by a direct reference (never a bare name, which pip would look up on PyPI, where a different
twinkle-kit lives), and the documents' extras must exist. A real pip install takes minutes.
"""

from __future__ import annotations

import shutil
import tomllib
import zipfile
from email.message import Message
from email.parser import Parser
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

import pytest
from hatchling.builders.wheel import WheelBuilder
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[3]
DISTRIBUTIONS = {
    "twinkle-client",
    "twinkle-data",
    "twinkle-kernels",
    "twinkle-kit",
    "twinkle-mesh",
    "twinkle-models",
    "twinkle-rl",
    "twinkle-server",
}
# The NPU page installs `.[transformers,ray]`; twinkle-kit's other extras are offered too.
DOCUMENTED_EXTRAS = {"transformers", "ray", "client", "megatron", "vllm"}
CACHES = shutil.ignore_patterns("__pycache__", ".pytest_cache", ".hypothesis", "build", "dist")


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The files the root build reads, copied so that the build writes nothing into the repo."""
    root = tmp_path.resolve() / "twinkle"
    root.mkdir()
    for name in ("pyproject.toml", "hatch_build.py"):
        shutil.copy2(REPO / name, root / name)
    for folder in ("packages", "cookbook"):  # twinkle-rl packs cookbook/quickstart.py
        shutil.copytree(REPO / folder, root / folder, ignore=CACHES)
    return root


def root_metadata(root: Path, version: str) -> Message:
    wheel = next(WheelBuilder(str(root)).build(directory=str(root / "dist"), versions=[version]))
    with zipfile.ZipFile(wheel) as archive:
        return Parser().parsestr(archive.read("twinkle_workspace-0.dist-info/METADATA").decode())


def requirements(metadata: Message) -> list[Requirement]:
    return [Requirement(line) for line in metadata.get_all("Requires-Dist", [])]


def unconditional(metadata: Message) -> dict[str, Requirement]:
    return {r.name: r for r in requirements(metadata) if r.marker is None}


def assert_no_bare_workspace_names(metadata: Message) -> None:
    bare = [str(r) for r in requirements(metadata) if r.name.startswith("twinkle-") and not r.url]
    assert not bare, f"pip would look these up on PyPI: {bare}"


def test_pip_install_takes_every_distribution_from_this_checkout(checkout: Path) -> None:
    metadata = root_metadata(checkout, "standard")
    assert_no_bare_workspace_names(metadata)
    found = unconditional(metadata)
    assert set(found) == DISTRIBUTIONS
    for name, requirement in found.items():
        assert requirement.url == (checkout / "packages" / name).as_uri()
        assert not requirement.extras


def test_the_documents_extras_exist_and_mirror_twinkle_kit(checkout: Path) -> None:
    metadata = root_metadata(checkout, "standard")
    kit_pyproject = tomllib.loads((checkout / "packages/twinkle-kit/pyproject.toml").read_text())
    kit_extras = set(kit_pyproject["project"]["optional-dependencies"])
    provided = set(metadata.get_all("Provides-Extra"))
    assert provided == {"transformers", *kit_extras}
    assert provided >= DOCUMENTED_EXTRAS
    kit_uri = (checkout / "packages" / "twinkle-kit").as_uri()
    by_extra: dict[str, list[Requirement]] = {}
    for requirement in requirements(metadata):
        for extra in provided:
            if requirement.marker and requirement.marker.evaluate({"extra": extra}):
                by_extra.setdefault(extra, []).append(requirement)
    assert "transformers" not in by_extra  # the default backend: nothing more to install
    for extra in kit_extras:
        [requirement] = by_extra[extra]
        assert (requirement.name, requirement.extras, requirement.url) == (
            "twinkle-kit",
            {extra},
            kit_uri,
        )


def test_editable_install_points_every_distribution_at_its_sources(checkout: Path) -> None:
    metadata = root_metadata(checkout, "editable")
    assert_no_bare_workspace_names(metadata)
    found = unconditional(metadata)
    assert set(found) == DISTRIBUTIONS
    for name, requirement in found.items():
        wheel = Path(url2pathname(urlparse(requirement.url).path))
        assert wheel.parent == checkout / "build" / "editable-wheels"
        with zipfile.ZipFile(wheel) as archive:
            [inner] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
            assert Parser().parsestr(archive.read(inner).decode())["Name"] == name
            paths = [
                line
                for member in archive.namelist()
                if member.endswith(".pth")
                for line in archive.read(member).decode().splitlines()
            ]
        # twinkle-kit ships no code; every other distribution imports from its src folder.
        sources = [] if name == "twinkle-kit" else [str(checkout / "packages" / name / "src")]
        assert paths == sources


def test_an_extra_out_of_step_with_twinkle_kit_is_named(checkout: Path) -> None:
    pyproject = checkout / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("\nvllm = []\n", "\n", 1))
    with pytest.raises(ValueError, match=r"declares the extras \[.*\].*'vllm'.*each empty"):
        root_metadata(checkout, "standard")
