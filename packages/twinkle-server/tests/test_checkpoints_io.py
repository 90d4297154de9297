"""Checkpoints in and out, in process: archives through signed links, publish/unpublish,
TTLs and expiry, importing a peft adapter, pushing to an offline hub's mirror.

The archive a client gets must be a plain peft folder that peft loads onto the base model
(the same logits the server's adapter gives), one whole version of the checkpoint even
while a save replaces it; another key's unpublished checkpoint is a 404 everywhere.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from pathlib import Path

import pytest
import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from peft import PeftModel
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from twinkle.data_format import from_jsonable
from twinkle.model.checkpoint import TRAINER_STATE, atomic_folder
from twinkle.model.transformers.loading import load_causal_lm
from twinkle.server import archive, checkpoint_access, download_links
from twinkle.server.errors import Conflict

FEATURE = {"input_ids": [1, 2, 3, 4, 5, 6], "labels": [-100, -100, 3, 4, 5, 6]}
BASE = "bundled://tiny-qwen3"


@pytest.fixture(scope="module")
def tenants(server, make_tenant):
    state, http, keys = server
    return state, make_tenant(http, keys["alice"]), make_tenant(http, keys["bob"])


@pytest.fixture(scope="module")
def saved(tenants):
    """Alice's trained run and its checkpoint weights/c1."""
    _, alice, _ = tenants
    run = alice.new_run(rank=4)
    alice.ok(run, "set_optimizer", optimizer_cls="AdamW", lr=5e-2)
    for _ in range(2):
        alice.ok(run, "forward_backward", inputs=[FEATURE])
        alice.ok(run, "step")
        alice.ok(run, "zero_grad")
    return run, alice.ok(run, "save", name="c1")


def _archive(tenant, run: str, checkpoint_id: str = "weights/c1"):
    """The archive route's redirect, and the bytes its link serves without the key."""
    route = f"/api/v1/training_runs/{run}/checkpoints/{checkpoint_id}/archive"
    redirect = tenant.http.get(route, headers=tenant.headers, follow_redirects=False)
    if redirect.status_code != 302:
        return redirect, None
    return redirect, tenant.http.get(redirect.headers["location"])


def _logps(result) -> torch.Tensor:
    return torch.as_tensor(from_jsonable(result["logps"]), dtype=torch.float32)


def _members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def _tar(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _import(tenant, data: bytes, name: str):
    headers = {**tenant.headers, "content-type": "application/gzip"}
    return tenant.http.post(
        f"/api/v1/checkpoints/import?name={name}", content=data, headers=headers
    )


def test_the_archive_is_a_peft_folder_that_peft_loads_with_the_servers_logits(tenants, saved):
    _, alice, _ = tenants
    run, uri = saved
    redirect, download = _archive(alice, run)
    assert redirect.status_code == 302 and "GMT" in redirect.headers["expires"]
    assert download.status_code == 200 and download.headers["content-type"] == "application/gzip"
    files = _members(download.content)
    assert sorted(files) == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads(files["adapter_config.json"])
    assert config["base_model_name_or_path"] == BASE  # not the server's folder
    assert config["r"] == 4

    folder = alice.get(f"/training_runs/{run}/checkpoints/weights/c1").json()["path"]
    assert (
        files["adapter_model.safetensors"]
        == (Path(folder) / "adapter_model.safetensors").read_bytes()
    )

    local = Path(folder).parent / "unpacked-by-test"
    local.mkdir()
    for name, data in files.items():
        (local / name).write_bytes(data)
    base, _ = load_causal_lm(BASE, None, None, seed=0)
    peft = PeftModel.from_pretrained(base, str(local)).eval()
    ids = torch.tensor([FEATURE["input_ids"]])
    with torch.no_grad():
        logps = torch.log_softmax(peft(input_ids=ids).logits.float(), -1)[0, :-1]
    expected = logps.gather(-1, ids[0, 1:, None])[:, 0]
    served = _logps(alice.ok(run, "forward_only", inputs=[FEATURE]))
    torch.testing.assert_close(served[0, 2:], expected[1:], atol=1e-5, rtol=0)


def test_a_foreign_checkpoint_is_404_until_published_and_404_again_after(tenants, saved):
    _, alice, bob = tenants
    run, uri = saved
    base = f"/training_runs/{run}/checkpoints/weights/c1"
    assert _archive(bob, run)[0].status_code == 404
    assert bob.post("/weights_info", {"twinkle_path": uri}).status_code == 404
    for response in (
        bob.post(f"{base}/publish"),
        bob.http.put(f"/api/v1{base}/ttl", json={"ttl_seconds": 3600}, headers=bob.headers),
    ):
        assert response.status_code == 404, response.text

    assert alice.post(f"{base}/publish").status_code == 200
    listed = alice.get(f"/training_runs/{run}/checkpoints").json()["checkpoints"]
    assert [c["public"] for c in listed if c["checkpoint_id"] == "weights/c1"] == [True]
    redirect, download = _archive(bob, run)
    assert redirect.status_code == 302 and download.status_code == 200
    assert bob.post("/weights_info", {"twinkle_path": uri}).json()["lora_rank"] == 4
    # read-only: bob may not unpublish, expire or delete it
    assert bob.delete(f"{base}/publish").status_code == 404
    assert bob.delete(base).status_code == 404
    bob_run = bob.new_run(rank=4)
    assert bob.call(bob_run, "load", path=uri).status_code == 200  # published: readable

    link = redirect.headers["location"]
    assert alice.delete(f"{base}/publish").status_code == 200
    assert _archive(bob, run)[0].status_code == 404
    assert bob.http.get(link).status_code == 404  # the link made while public: gone too
    assert bob.call(bob_run, "load", path=uri).status_code == 404
    bob.post("/twinkle/model/remove_adapter", {"training_run_id": bob_run})


@pytest.mark.parametrize(
    ("body", "what"),
    [
        ('{"ttl_seconds": -5}', "-5"),
        ('{"ttl_seconds": NaN}', None),
        ('{"ttl_seconds": 1e300}', "1e+300"),
        ('{"ttl_seconds": 315360001}', "315360001"),
        ('{"ttl_seconds": 1.5}', "1.5"),
        ('{"ttl_seconds": "soon"}', "soon"),
        ("{}", None),
    ],
)
def test_a_bad_ttl_is_a_400_naming_the_limit(tenants, saved, body, what):
    _, alice, _ = tenants
    run, _ = saved
    headers = {**alice.headers, "content-type": "application/json"}
    response = alice.http.put(
        f"/api/v1/training_runs/{run}/checkpoints/weights/c1/ttl", content=body, headers=headers
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    if what is not None:
        assert "limits.max_checkpoint_ttl_s" in error and "315360000" in error and what in error


def test_a_ttl_lists_expires_at_and_the_reaper_deletes_the_expired(tenants, saved):
    state, alice, bob = tenants
    run, _ = saved
    alice.ok(run, "save", name="brief")
    base = f"/api/v1/training_runs/{run}/checkpoints/weights/brief"
    answer = alice.http.put(f"{base}/ttl", json={"ttl_seconds": 3600}, headers=alice.headers)
    assert answer.status_code == 200, answer.text
    listed = {
        c["checkpoint_id"]: c
        for c in alice.get(f"/training_runs/{run}/checkpoints").json()["checkpoints"]
    }
    expires = listed["weights/brief"]["expires_at"]
    assert expires is not None and listed["weights/c1"]["expires_at"] is None
    assert 3590 < _seconds(expires) - time.time() <= 3600
    folder = Path(alice.get(f"/training_runs/{run}/checkpoints/weights/brief").json()["path"])

    key = alice.key_id()
    state.store.set_checkpoint_expiry(key, run, "weights", "brief", time.time() - 1)
    listed = alice.get(f"/training_runs/{run}/checkpoints").json()["checkpoints"]
    assert "weights/brief" not in [c["checkpoint_id"] for c in listed]  # gone at once
    assert _archive(alice, run, "weights/brief")[0].status_code == 404
    assert folder.is_dir()
    assert checkpoint_access.reap_expired(state.store) == 1
    assert not folder.exists() and state.store.get_checkpoint(key, run, "weights", "brief") is None
    answer = alice.http.put(f"{base}/ttl", json={"ttl_seconds": None}, headers=alice.headers)
    assert answer.status_code == 404


def _seconds(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


def test_a_link_altered_forged_or_expired_is_404(tenants, saved):
    state, alice, _ = tenants
    run, _ = saved
    redirect, _ = _archive(alice, run)
    token = redirect.headers["location"].rsplit("/", 1)[-1]
    payload, mac = token.split(".")
    grant = json.loads(__import__("base64").urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    grant["name"] = "other"
    forged = download_links._b64(json.dumps(grant).encode()) + "." + mac
    expired = download_links.sign(
        download_links.server_secret(state.home),
        download_links.Grant(
            grant["owner"], run, "weights", "c1", "", time.time() - 1, grant["owner"]
        ),
    )
    for bad in (forged, token[:-2] + "xx", expired, "nonsense"):
        response = alice.http.get(f"/api/v1/downloads/{bad}")
        assert response.status_code == 404, response.text


def test_an_archive_is_one_whole_version_while_a_save_replaces_it(tmp_path):
    final = tmp_path / "ck"

    def write(version: bytes) -> None:
        with atomic_folder(final, marker=TRAINER_STATE) as tmp:
            (tmp / "adapter_config.json").write_text('{"peft_type": "LORA"}')
            (tmp / "adapter_model.safetensors").write_bytes(version * 1000)
            (tmp / TRAINER_STATE).write_text("{}")

    write(b"old")
    with archive.open_version(final, archive.ADAPTER_FILES) as files:
        write(b"new")  # renamed aside and deleted under the open handles
        assert files["adapter_model.safetensors"].read() == b"old" * 1000
    tar = archive.build_archive(final, BASE)
    assert _members(tar.read())["adapter_model.safetensors"] == b"new" * 1000
    (final / TRAINER_STATE).unlink()  # a folder that never completes is refused
    with (
        pytest.raises(Conflict, match="being written"),
        archive.open_version(final, archive.ADAPTER_FILES),
    ):
        pass


def test_an_archive_of_a_checkpoint_being_written_waits_then_refuses(tenants, saved, monkeypatch):
    state, alice, _ = tenants
    run, _ = saved
    from twinkle.server.routes import checkpoints_io

    monkeypatch.setattr(checkpoints_io, "WAIT_FOR_SAVE_S", 0.5)
    folder = Path(alice.get(f"/training_runs/{run}/checkpoints/weights/c1").json()["path"]).parent
    writing = folder / ".pending.tmp-test"
    writing.mkdir()
    try:
        response = _archive(alice, run, "weights/pending")[0]
    finally:
        writing.rmdir()
    assert response.status_code == 409 and "being written" in response.json()["error"]
    assert _archive(alice, run, "weights/pending")[0].status_code == 404  # nothing writing


def test_an_imported_adapter_loads_and_trains_like_the_original(tenants, saved):
    _, alice, bob = tenants
    run, uri = saved
    data = _archive(alice, run)[1].content
    answer = _import(bob, data, "from-alice")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["training_run_id"].startswith("import-") and body["lora_config"]["r"] == 4
    assert body["tinker_path"] == body["twinkle_path"].replace("twinkle://", "tinker://")
    listed = bob.get(f"/training_runs/{body['training_run_id']}/checkpoints").json()
    assert [c["checkpoint_id"] for c in listed["checkpoints"]] == ["weights/from-alice"]
    assert _import(bob, data, "from-alice").status_code == 200  # a new run each time

    original = _logps(alice.ok(run, "forward_only", inputs=[FEATURE]))
    # the adapter is added with the LoRA config the import answered
    adapter = {"session_id": bob.session, "adapter_name": "imp", "config": body["lora_config"]}
    added = bob.post("/twinkle/model/add_adapter_to_model", adapter)
    assert added.status_code == 200, added.text
    bob_run = added.json()["result"]["training_run_id"]
    assert bob.call(bob_run, "load", path=body["twinkle_path"]).status_code == 200
    imported = _logps(bob.ok(bob_run, "forward_only", inputs=[FEATURE]))
    torch.testing.assert_close(imported, original, atol=1e-6, rtol=0)
    bob.ok(bob_run, "set_optimizer", optimizer_cls="AdamW", lr=1e-2)
    bob.ok(bob_run, "forward_backward", inputs=[FEATURE])
    bob.ok(bob_run, "step")
    moved = _logps(bob.ok(bob_run, "forward_only", inputs=[FEATURE]))
    assert not torch.allclose(moved, imported)
    bob.post("/twinkle/model/remove_adapter", {"training_run_id": bob_run})


def _peft_files(tenants, saved) -> dict[str, bytes]:
    _, alice, _ = tenants
    return _members(_archive(alice, saved[0])[1].content)


def test_bad_imports_are_400s_naming_what_is_wrong(tenants, saved):
    state, _, bob = tenants
    files = _peft_files(tenants, saved)
    config = json.loads(files["adapter_config.json"])
    tensors = load_safetensors(files["adapter_model.safetensors"])
    key = next(iter(tensors))
    wide = {**tensors, key: torch.zeros(tensors[key].shape[0] + 1, tensors[key].shape[1])}
    nan = {**tensors, key: torch.full_like(tensors[key], float("nan"))}
    cases = {
        "gzipped tar": b"not an archive",
        "no adapter_model.safetensors": _tar({"adapter_config.json": files["adapter_config.json"]}),
        "climbs out": _tar({**files, "../evil": b"x"}),
        "max_rank": _tar(
            {**files, "adapter_config.json": json.dumps({**config, "r": 64}).encode()}
        ),
        "LoRA adapter": _tar({**files, "adapter_config.json": b'{"peft_type": "IA3"}'}),
        "use_dora": _tar(
            {**files, "adapter_config.json": json.dumps({**config, "use_dora": True}).encode()}
        ),
        "has shape": _tar({**files, "adapter_model.safetensors": save_safetensors(wide)}),
        "finite": _tar({**files, "adapter_model.safetensors": save_safetensors(nan)}),
        "missing": _tar(
            {**files, "adapter_model.safetensors": save_safetensors({key: tensors[key]})}
        ),
    }
    runs_before = state.store.list_runs(bob.key_id(), 1000, 0)[1]
    for expected, data in cases.items():
        response = _import(bob, data, "bad")
        assert response.status_code == 400, (expected, response.text)
        assert expected in response.json()["error"], (expected, response.json()["error"])
    assert _import(bob, _tar(files), "../x").status_code == 400
    assert state.store.list_runs(bob.key_id(), 1000, 0)[1] == runs_before  # nothing recorded


def test_a_push_to_the_offline_hubs_mirror_resolves_as_a_hub_id_peft_loads(
    tenants, saved, tmp_path, monkeypatch
):
    from twinkle.hub import resolve_model

    _, alice, bob = tenants
    run, uri = saved
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    base = f"/training_runs/{run}/checkpoints/weights/c1/push"
    pushed = alice.post(base, {"repo_id": "alice/tiny-lora"})
    assert pushed.status_code == 200, pushed.text
    assert pushed.json()["hub"] == "mirror" and str(tmp_path) not in pushed.text
    folder = resolve_model("hf://alice/tiny-lora")
    assert folder.name == pushed.json()["revision"]
    archived = _peft_files(tenants, saved)
    for name, data in archived.items():
        assert (folder / name).read_bytes() == data
    base_model, _ = load_causal_lm(BASE, None, None, seed=0)
    assert PeftModel.from_pretrained(base_model, str(folder)).peft_config["default"].r == 4

    alice.ok(run, "forward_backward", inputs=[FEATURE])
    alice.ok(run, "step")
    alice.ok(run, "zero_grad")
    alice.ok(run, "save", name="c2")  # new weights: a new revision moves main, the old stays
    again = alice.post(
        f"/training_runs/{run}/checkpoints/weights/c2/push", {"repo_id": "alice/tiny-lora"}
    )
    assert again.json()["revision"] != pushed.json()["revision"]
    assert resolve_model("hf://alice/tiny-lora").name == again.json()["revision"]
    assert folder.is_dir()

    assert bob.post(base, {"repo_id": "bob/stolen"}).status_code == 404
    for repo_id in ("no-slash", "../up/x", "a/b/c", None, 7):
        response = alice.post(base, {"repo_id": repo_id})
        assert response.status_code == 400 and "org/name" in response.json()["error"]
    assert alice.post(base, {"repo_id": "a/b", "token": 5}).status_code == 400


class FakeHub:
    """A local stand-in of the hub's HTTP API, as ``huggingface_hub`` uses it to push: create
    a repo, ask how each file uploads (``preupload``: all "regular", no LFS), then one commit
    of NDJSON lines carrying the files base64-encoded. It keeps what it received and the
    path and ``Authorization`` header of every call; ``refuse`` makes it answer 403."""

    def __init__(self) -> None:
        self.repos: dict[str, dict] = {}
        self.files: dict[str, dict[str, bytes]] = {}
        self.calls: list[tuple[str, str | None]] = []  # (path, Authorization)
        self.refuse = False
        self.url = ""
        app = FastAPI()

        @app.middleware("http")
        async def record(request: Request, call_next):
            self.calls.append((request.url.path, request.headers.get("authorization")))
            if self.refuse:
                return JSONResponse({"error": "You don't have the rights"}, status_code=403)
            return await call_next(request)

        @app.post("/api/repos/create")
        async def create(request: Request):
            body = await request.json()
            repo_id = (
                f"{body['organization']}/{body['name']}"
                if body.get("organization")
                else body["name"]
            )
            if repo_id in self.repos:
                taken = {
                    "error": "You already created this model repo",
                    "url": f"{self.url}/{repo_id}",
                }
                return JSONResponse(taken, 409)
            self.repos[repo_id] = body
            return {"url": f"{self.url}/{repo_id}", "name": repo_id}

        @app.post("/api/models/{org}/{name}/preupload/{revision}")
        async def preupload(org: str, name: str, revision: str, request: Request):
            files = (await request.json())["files"]
            return {
                "files": [
                    {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                    for f in files
                ]
            }

        @app.post("/api/models/{org}/{name}/commit/{revision}")
        async def commit(org: str, name: str, revision: str, request: Request):
            import base64
            import hashlib

            repo_id = f"{org}/{name}"
            if repo_id not in self.repos:
                return JSONResponse({"error": "Repository not found"}, 404)
            received = {}
            for line in (await request.body()).decode().splitlines():
                item = json.loads(line)
                if item["key"] == "file":
                    received[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
            self.files[repo_id] = received
            oid = hashlib.sha1(b"".join(received[k] for k in sorted(received))).hexdigest()
            return {"commitUrl": f"{self.url}/{repo_id}/commit/{oid}", "commitOid": oid}

        self.app = app


@pytest.fixture
def fake_hub(monkeypatch):
    """The fake hub on a free local port (a uvicorn server on a thread), where
    ``huggingface_hub`` sends the push: its endpoint, as ``HF_ENDPOINT`` sets it."""
    import socket
    import threading

    import uvicorn
    from huggingface_hub import constants

    hub = FakeHub()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hub.url = f"http://127.0.0.1:{port}"
    server = uvicorn.Server(uvicorn.Config(hub.app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TWINKLE_HUB_OFFLINE", raising=False)
    yield hub
    server.should_exit = True
    thread.join(timeout=10)


def test_an_online_push_sends_the_peft_files_to_the_hub_with_the_callers_token(
    tenants, saved, fake_hub
):
    state, alice, bob = tenants
    run, _ = saved
    base = f"/training_runs/{run}/checkpoints/weights/c1/push"
    token = "hf_secret_token_of_alice"
    pushed = alice.post(base, {"repo_id": "alice/tiny-lora", "token": token, "private": True})
    assert pushed.status_code == 200, pushed.text
    answer = pushed.json()
    assert answer["hub"] == "hf" and answer["repo_id"] == "alice/tiny-lora"
    assert fake_hub.files["alice/tiny-lora"] == _peft_files(tenants, saved)
    assert answer["url"].endswith(answer["revision"]) and len(answer["revision"]) == 40
    assert fake_hub.repos["alice/tiny-lora"]["visibility"] == "private"
    pushes = [(path, auth) for path, auth in fake_hub.calls if auth is not None]
    assert pushes == [  # the client's own lookups carry no credentials
        ("/api/repos/create", f"Bearer {token}"),
        ("/api/models/alice/tiny-lora/preupload/main", f"Bearer {token}"),
        ("/api/models/alice/tiny-lora/commit/main", f"Bearer {token}"),
    ]
    again = alice.post(base, {"repo_id": "alice/tiny-lora", "token": token})
    assert again.status_code == 200, again.text  # the repo exists already: pushed into it

    fake_hub.refuse = True
    refused = alice.post(base, {"repo_id": "alice/tiny-lora", "token": "hf_wrong"})
    assert refused.status_code == 400, refused.text
    assert "the hub refused the push to alice/tiny-lora" in refused.json()["error"]
    assert "hf_wrong" not in refused.text
    assert bob.post(base, {"repo_id": "bob/x", "token": token}).status_code == 404


def test_an_online_push_to_a_hub_that_cannot_be_reached_is_a_503(tenants, saved, monkeypatch):
    from huggingface_hub import constants

    _, alice, _ = tenants
    run, _ = saved
    monkeypatch.setattr(constants, "ENDPOINT", _closed_port_url())
    base = f"/training_runs/{run}/checkpoints/weights/c1/push"
    answer = alice.post(base, {"repo_id": "alice/tiny-lora", "token": "hf_x"})
    assert answer.status_code == 503, answer.text
    assert "the hub cannot be reached to push alice/tiny-lora" in answer.json()["error"]


def _closed_port_url() -> str:
    """A local URL nothing listens on (a port bound and released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"
