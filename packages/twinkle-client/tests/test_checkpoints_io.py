"""The client's checkpoint transfers against a scripted server: a download lands whole or
not at all, an unsafe archive is refused, the routes and bodies are the server's."""

import io
import tarfile

import httpx
import pytest

from twinkle_client import checkpoints_io
from twinkle_client.errors import NotFoundError, TwinkleClientError
from twinkle_client.http import Transport

PATH = "tinker://sess-1:train:0/weights/final"
FILES = {"adapter_config.json": b'{"peft_type": "LORA"}', "adapter_model.safetensors": b"w" * 64}


def _tar(files: dict[str, bytes], kind=tarfile.REGTYPE) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.type = len(data), kind
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _serving(archive: bytes, status: int = 200):
    """The archive route redirecting to a link, and the link serving ``archive``."""
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.endswith("/archive"):
            return httpx.Response(302, headers={"location": "http://server/api/v1/downloads/t"})
        if status != 200:
            return httpx.Response(status, json={"error": "no checkpoint", "category": "user"})
        return httpx.Response(200, content=archive)

    http = httpx.Client(transport=httpx.MockTransport(handler))
    return Transport("http://server", "tml-key", backoff=0.0, http_client=http), seen


def test_a_download_follows_the_link_and_unpacks_the_peft_folder(tmp_path):
    transport, seen = _serving(_tar(FILES))
    out = checkpoints_io.download(transport, PATH, tmp_path / "adapter")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == FILES  # no staging left
    assert (
        seen[0].url.path == "/api/v1/training_runs/sess-1:train:0/checkpoints/weights/final/archive"
    )
    assert seen[0].headers["x-api-key"] == "tml-key"
    assert seen[1].url.path == "/api/v1/downloads/t"


@pytest.mark.parametrize(
    "archive",
    [
        _tar({**FILES, "../evil": b"x"}),
        _tar({**FILES, "sub/dir": b"x"}),
        _tar({"link": b""}, kind=tarfile.SYMTYPE),
        b"not gzip",
    ],
    # gzip stamps the time: ids from the bytes would differ between pytest-xdist workers
    ids=["parent path", "nested path", "symlink", "not gzip"],
)
def test_an_unsafe_or_broken_archive_leaves_the_folder_untouched(tmp_path, archive):
    out = tmp_path / "adapter"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    transport, _ = _serving(archive)
    with pytest.raises(TwinkleClientError):
        checkpoints_io.download(transport, PATH, out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert not (tmp_path / "evil").exists()


def test_a_refused_download_raises_the_servers_error_and_writes_nothing(tmp_path):
    transport, _ = _serving(b"", status=404)
    with pytest.raises(NotFoundError, match="no checkpoint"):
        checkpoints_io.download(transport, PATH, tmp_path / "adapter")
    assert list((tmp_path / "adapter").iterdir()) == []


def test_paths_packing_and_ttls_are_checked_before_any_request(tmp_path):
    for bad in ("weights/final", "tinker://run/weights", "s3://run/weights/x", None):
        with pytest.raises(TwinkleClientError, match="not a checkpoint path"):
            checkpoints_io.checkpoint_route(bad)
    with pytest.raises(TwinkleClientError, match="adapter_model.safetensors"):
        checkpoints_io.pack(tmp_path)
    for name, data in FILES.items():
        (tmp_path / name).write_bytes(data)
    with tarfile.open(fileobj=io.BytesIO(checkpoints_io.pack(tmp_path)), mode="r:gz") as tar:
        assert {m.name: tar.extractfile(m).read() for m in tar.getmembers()} == FILES
    for bad in (1.5, "60", True):
        with pytest.raises(TypeError):
            checkpoints_io.ttl_body(bad)
    assert checkpoints_io.ttl_body(None) == {"ttl_seconds": None}
