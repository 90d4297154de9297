"""Rate and size limits, checked before any work starts (no model needed)."""

import pytest
from fastapi.testclient import TestClient

from twinkle.server.app import create_app
from twinkle.server.auth import create_key
from twinkle.server.config import ServerConfig
from twinkle.server.errors import RateLimited
from twinkle.server.limits import RateLimiter
from twinkle.server.state import build_state


def test_the_rate_limiter_counts_per_key():
    limiter = RateLimiter(per_minute=2)
    limiter.check("alice")
    limiter.check("alice")
    with pytest.raises(RateLimited):
        limiter.check("alice")
    limiter.check("bob")  # another key has its own bucket


@pytest.fixture
def bare_app(tmp_path):
    config = ServerConfig.model_validate(
        {
            "storage": {"home": str(tmp_path)},
            "limits": {"max_body_bytes": 4096, "requests_per_minute": 3},
        }
    )
    state = build_state(config, load_components=False)
    key = create_key(state.store, "alice")[0]
    with TestClient(create_app(state), raise_server_exceptions=False) as http:
        yield http, {"X-API-Key": key}
    state.close()


def test_bodies_over_the_limit_get_413_declared_or_streamed(bare_app):
    http, headers = bare_app
    declared = http.post(
        "/api/v1/create_session", content=b"{" + b" " * 5000 + b"}", headers=headers
    )
    assert declared.status_code == 413 and declared.json()["code"] == "payload_too_large"

    def chunks():
        yield b'{"user_metadata": {"x": "'
        for _ in range(10):
            yield b"a" * 1000
        yield b'"}}'

    streamed = http.post("/api/v1/create_session", content=chunks(), headers=headers)
    assert streamed.status_code == 413 and streamed.json()["category"] == "user"


def test_a_key_over_its_rate_gets_429_and_a_loading_server_503(bare_app):
    http, headers = bare_app
    assert http.get("/api/v1/healthz").status_code == 503  # components not loaded
    assert http.get("/api/v1/capacity", headers=headers).status_code == 503
    statuses = [http.get("/api/v1/training_runs", headers=headers).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
