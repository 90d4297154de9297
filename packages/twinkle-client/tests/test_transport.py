"""The HTTP layer against a scripted server: retries keep one idempotency key, errors are typed."""

import httpx
import pytest

from twinkle_client import TwinkleClient
from twinkle_client.errors import (
    AuthenticationError,
    BadRequestError,
    ConnectionFailed,
    NotFoundError,
    RateLimitError,
    RequestLostError,
    ServerError,
    SessionFinishedError,
    TwinkleClientError,
)
from twinkle_client.http import Transport


def scripted(responses):
    """A transport answering ``responses`` in order, recording each request."""
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = responses[min(len(seen) - 1, len(responses) - 1)]
        if isinstance(answer, Exception):
            raise answer
        status, body = answer
        return httpx.Response(status, json=body)

    http = httpx.Client(transport=httpx.MockTransport(handler))
    return Transport("http://server", "tml-key", backoff=0.0, http_client=http), seen


def test_retries_resend_the_same_idempotency_key_and_api_key():
    transport, seen = scripted(
        [
            httpx.ConnectError("down"),
            (503, {"error": "loading", "category": "server"}),
            (408, {"error": "slow", "category": "user"}),
            (200, {"result": 1}),
        ]
    )
    assert transport.request("POST", "/twinkle/model/step", {"x": 1}) == {"result": 1}
    keys = {r.headers["x-idempotency-key"] for r in seen}
    assert len(seen) == 4 and len(keys) == 1
    assert all(r.headers["x-api-key"] == "tml-key" for r in seen)
    assert str(seen[0].url) == "http://server/api/v1/twinkle/model/step"


def test_two_calls_use_two_idempotency_keys():
    transport, seen = scripted([(200, {})])
    transport.request("POST", "/a", {})
    transport.request("POST", "/a", {})
    assert seen[0].headers["x-idempotency-key"] != seen[1].headers["x-idempotency-key"]


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (400, BadRequestError),
        (401, AuthenticationError),
        (404, NotFoundError),
        (422, BadRequestError),
        (500, ServerError),
    ],
)
def test_errors_are_typed_and_not_retried(status, error):
    transport, seen = scripted([(status, {"error": "no", "category": "user", "code": "c"})])
    with pytest.raises(error) as info:
        transport.request("POST", "/x", {})
    assert len(seen) == 1
    assert (info.value.status, info.value.category, info.value.message) == (status, "user", "no")


def test_retries_give_up_with_the_last_error():
    transport, seen = scripted([(429, {"error": "slow down", "category": "user"})])
    with pytest.raises(RateLimitError):
        transport.request("GET", "/x")
    assert len(seen) == 4
    transport, _ = scripted([httpx.ConnectError("down")])
    with pytest.raises(ConnectionFailed):
        transport.request("GET", "/x")


def test_the_client_reads_its_url_and_key_from_the_environment(monkeypatch):
    monkeypatch.setenv("TWINKLE_SERVER_URL", "http://from-env:9")
    monkeypatch.delenv("TWINKLE_SERVER_TOKEN", raising=False)
    with pytest.raises(TwinkleClientError, match="TWINKLE_SERVER_TOKEN"):
        TwinkleClient()
    monkeypatch.setenv("TWINKLE_SERVER_TOKEN", "tml-env")
    transport, seen = scripted([(200, {"session_id": "sess-1"})])
    client = TwinkleClient(
        api_key="EMPTY_TOKEN", transport=transport, session_heartbeat_interval=3600
    )
    assert client.base_url == "http://from-env:9" and client.session_id == "sess-1"
    client.close()


def test_a_request_lost_to_a_server_restart_raises_at_once():
    """The connection drops, the server restarts, the retry (same idempotency key) finds the
    request lost: RequestLostError on that answer, with no further retries."""
    lost = {"error": "the server restarted; submit it again", "category": "server", "code": "lost"}
    transport, seen = scripted([httpx.ConnectError("restarting"), (410, lost), (200, {})])
    with pytest.raises(RequestLostError, match="submit it again") as caught:
        transport.request("POST", "/twinkle/model/forward_backward", {})
    assert len(seen) == 2 and caught.value.status == 410 and caught.value.code == "lost"


def test_a_finished_session_is_not_a_lost_request():
    finished = {"error": "session finished", "category": "user", "code": "session_finished"}
    transport, _ = scripted([(410, finished)])
    with pytest.raises(SessionFinishedError):
        transport.request("POST", "/session_heartbeat", {})
