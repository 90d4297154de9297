"""A real server process on the tiny model, as a tenant and its operator meet it: the official
``openai`` client against /v1 (models, chat and completions, streaming, logprobs, another
key's adapter a 404, bad values a 400), Prometheus /metrics, and the dashboard in headless
Chromium (playwright), with a screenshot and assertions on its DOM.

Chromium: playwright's own (``playwright install chromium``) or a system one
(``apt install chromium-headless-shell``, where playwright's download host is unreachable).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

BASE = "bundled://tiny-qwen3"
FEATURE = {"input_ids": [1, 2, 3, 4, 5, 6], "labels": [-100, -100, 3, 4, 5, 6]}
STEPS = 3
SYSTEM_CHROMIUM = ("chromium-headless-shell", "chromium", "chromium-browser")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(home: Path, config: Path, *args: str) -> str:
    env = {**os.environ, "TWINKLE_HOME": str(home), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "twinkle.server", *args, "-c", str(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


class Live:
    def __init__(self, url: str, alice: str, bob: str) -> None:
        self.url, self.alice, self.bob = url, alice, bob
        self.http = httpx.Client(base_url=f"{url}/api/v1", headers={"X-API-Key": alice}, timeout=60)

    def post(self, path: str, body: dict) -> dict:
        answer = self.http.post(path, json=body)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def call(self, run: str, method: str, **args) -> object:
        body = {"training_run_id": run, "args": args}
        return self.post(f"/twinkle/model/{method}", body)["result"]

    def client(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    home = tmp_path_factory.mktemp("served")
    port = _free_port()
    config = home / "config.yaml"
    config.write_text(
        f"port: {port}\nmodel: {{model_id: '{BASE}', max_loras: 2, device: cpu}}\n"
        f"sampler: {{enabled: true, kind: torch, max_tokens: 32}}\nstorage: {{home: '{home}'}}\n"
    )
    alice = _cli(home, config, "keys", "create", "--name", "alice")
    bob = _cli(home, config, "keys", "create", "--name", "bob")
    env = {**os.environ, "TWINKLE_HOME": str(home), "OMP_NUM_THREADS": "1"}
    with open(home / "server.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "twinkle.server", "launch", "-c", str(config)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, (home / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the server did not become ready"
            try:
                if httpx.get(f"{url}/api/v1/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        server = Live(url, alice, bob)
        session = server.post("/create_session", {})["session_id"]
        body = {"session_id": session, "config": {"r": 4, "target_modules": "all-linear"}}
        run = server.post("/twinkle/model/add_adapter_to_model", body)["result"]["training_run_id"]
        server.call(run, "set_optimizer", optimizer_cls="AdamW", lr=5e-2)
        for _ in range(STEPS):
            server.call(run, "forward_backward", inputs=[FEATURE])
            server.call(run, "step")
            server.call(run, "zero_grad")
        uri = server.call(run, "save", name="s1", kind="sampler_weights", save_optimizer=False)
        yield server, run, uri
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_openai_client_lists_and_samples_the_callers_adapters(live):
    server, run, uri = live
    client = server.client(server.alice)
    assert [m.id for m in client.models.list()] == [BASE, uri, f"twinkle://{run}"]
    assert [m.id for m in server.client(server.bob).models.list()] == [BASE]
    chat = {
        "model": uri,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 8,
        "n": 2,
        "seed": 3,
        "logprobs": True,
        "top_logprobs": 2,
    }
    whole = client.chat.completions.create(**chat)
    assert len(whole.choices) == 2
    for choice in whole.choices:
        assert choice.finish_reason in ("stop", "length")
        assert all(len(entry.top_logprobs) == 2 for entry in choice.logprobs.content)
    assert whole.usage.completion_tokens == sum(len(c.logprobs.content) for c in whole.choices)
    texts = {0: "", 1: ""}
    for chunk in client.chat.completions.create(**chat, stream=True):
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert [texts[0], texts[1]] == [c.message.content for c in whole.choices]
    text = client.completions.create(
        model=f"twinkle://{run}", prompt="once upon", max_tokens=5, logprobs=1, temperature=0
    )
    choice = text.choices[0]
    assert "".join(choice.logprobs.tokens).startswith(choice.text[:1])
    assert len(choice.logprobs.token_logprobs) == text.usage.completion_tokens <= 5


def test_a_stream_sends_its_first_token_long_before_its_last(live):
    server, _, _ = live
    body = {"model": BASE, "prompt": [5, 17, 42], "max_tokens": 32, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {server.alice}"}
    for _ in range(2):  # the first stream also pays the sampler's one-off start-up
        arrivals = []
        start = time.perf_counter()
        with httpx.stream(
            "POST", f"{server.url}/v1/completions", json={**body, "stream": True}, headers=headers
        ) as answer:
            for line in answer.iter_lines():
                if line.startswith("data: {"):
                    arrivals.append(time.perf_counter() - start)
    assert len(arrivals) == 32 + 1  # a chunk per token, then the finish
    # Tokens arrive as drawn: the first after the prompt and one step, not after all 32.
    assert arrivals[0] < arrivals[-1] / 2, arrivals


def test_the_openai_client_sees_refusals_as_its_own_errors(live):
    server, run, uri = live
    messages = [{"role": "user", "content": "hi"}]
    bob = server.client(server.bob)
    for model in (uri, f"twinkle://{run}"):
        with pytest.raises(openai.NotFoundError):
            bob.chat.completions.create(model=model, messages=messages, max_tokens=2)
    alice = server.client(server.alice)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        alice.chat.completions.create(model=BASE, messages=messages, temperature=5)
    with pytest.raises(openai.AuthenticationError):
        server.client("tml-not-a-key").models.list()


def _chromium() -> str | None:
    """A Chromium for playwright: its own download if present, else a system one."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        if Path(p.chromium.executable_path).exists():
            return p.chromium.executable_path
    return next((shutil.which(n) for n in SYSTEM_CHROMIUM if shutil.which(n)), None)


def test_metrics_and_the_dashboard_in_headless_chromium(live, tmp_path):
    server, run, uri = live
    key_id = server.http.get("/dashboard").json()["key"]["id"]
    metrics = httpx.get(f"{server.url}/metrics").text
    assert f'twinkle_tokens_trained_total{{tenant="{key_id}"}} {STEPS * 4}.0' in metrics
    assert f'twinkle_tokens_sampled_total{{tenant="{key_id}"}}' in metrics
    assert 'twinkle_lora_slots{state="used"} 1.0' in metrics
    chromium = _chromium()
    if chromium is None:
        pytest.skip("no Chromium: `playwright install chromium` or apt chromium-headless-shell")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True)
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.goto(f"{server.url}/dashboard")
        page.fill("#api-key", "tml-wrong")
        page.click("#connect")
        page.wait_for_selector("#status.error")
        assert "401" in page.inner_text("#status") and page.is_hidden("#content")
        page.fill("#api-key", server.alice)
        page.click("#connect")
        row = page.wait_for_selector(f'#run-rows tr[data-run-id="{run}"]')
        points = row.query_selector("svg.loss polyline").get_attribute("points").split()
        assert len(points) == STEPS
        assert page.inner_text("#slots-max") == "2" and page.inner_text("#slots-mine") == "1"
        assert page.query_selector(f'#checkpoint-rows tr[data-uri="{uri}"]') is not None
        assert page.inner_text('#queue-rows tr[data-worker="sampler"] td:nth-child(2)') == "0"
        assert "train_tokens" in page.inner_text("#usage-rows")
        shot = tmp_path / "dashboard.png"
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    if os.environ.get("TWINKLE_SCREENSHOT_DIR"):
        shutil.copy(shot, Path(os.environ["TWINKLE_SCREENSHOT_DIR"]) / "dashboard.png")
