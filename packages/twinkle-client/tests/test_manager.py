"""TwinkleClient's constructor, shared context, route prefix and exit, against a scripted server.

The listing and checkpoint methods run against a real server in
packages/twinkle-kit/tests/test_twinkle_client_page.py; these tests need no server.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest

from twinkle_client import TwinkleClient, TwinkleClientError, get_client, init_twinkle_client
from twinkle_client.dataset import Dataset, DatasetMeta
from twinkle_client.http import Transport
from twinkle_client.model import MultiLoraTransformersModel
from twinkle_client.sampler import vLLMSampler


class Scripted:
    """A server answering the session routes and component routes under ``prefix``."""

    def __init__(self, prefix: str = "/twinkle") -> None:
        self.prefix = prefix
        self.seen: list[httpx.Request] = []
        self.sessions = 0

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        path = request.url.path.removeprefix("/api/v1")
        body = json.loads(request.content) if request.content else {}
        if path == "/create_session":
            self.sessions += 1
            answer = {"session_id": f"sess-{self.sessions}", **body}
            return httpx.Response(200, json=answer)
        if path == "/session_heartbeat" or path.endswith("/finish"):
            return httpx.Response(200, json={})
        if path.startswith(self.prefix + "/"):
            return httpx.Response(200, json={"result": "ds-1" if "create" in path else 0})
        return httpx.Response(404, json={"error": "Not Found", "category": "user"})

    def transport(self) -> Transport:
        http = httpx.Client(transport=httpx.MockTransport(self.handler))
        return Transport("http://server", "tml-key", backoff=0.0, http_client=http)

    def paths(self) -> list[str]:
        return [r.url.path for r in self.seen]

    def beats(self, at_least: int, within_s: float = 10.0) -> list[httpx.Request]:
        """The heartbeats seen, once there are ``at_least`` (or the time is up)."""
        deadline = time.monotonic() + within_s
        while True:
            beats = [r for r in self.seen if r.url.path.endswith("/session_heartbeat")]
            if len(beats) >= at_least or time.monotonic() > deadline:
                return beats
            time.sleep(0.02)


def test_a_wrong_keyword_names_the_documented_ones():
    with pytest.raises(TypeError) as info:
        TwinkleClient("http://server", "tml-key", heartbeat=5)
    message = str(info.value)
    assert "'heartbeat' (did you mean 'session_heartbeat_interval'?)" in message
    for documented in (
        "base_url",
        "api_key",
        "route_prefix",
        "session_heartbeat_interval",
        "session_metadata",
    ):
        assert documented in message
    with pytest.raises(TypeError, match="got both 'heartbeat_interval' and"):
        TwinkleClient(heartbeat_interval=5, session_heartbeat_interval=5)


@pytest.mark.parametrize(
    ("keywords", "error", "names"),
    [
        ({"session_metadata": ["alice"]}, TypeError, "session_metadata must be a dict"),
        ({"session_metadata": {"when": object()}}, TypeError, "session_metadata must be JSON"),
        ({"session_heartbeat_interval": 0}, ValueError, "session_heartbeat_interval"),
        ({"session_heartbeat_interval": "10"}, ValueError, "session_heartbeat_interval"),
        ({"route_prefix": "twinkle"}, ValueError, "route_prefix must be a path"),
    ],
)
def test_bad_values_are_refused_before_any_request(keywords, error, names):
    server = Scripted()
    with pytest.raises(error, match=names):
        TwinkleClient(api_key="tml-key", transport=server.transport(), **keywords)
    assert server.seen == []


def test_the_documented_keywords_reach_the_server_and_heartbeats_follow_the_interval():
    server = Scripted()
    client = TwinkleClient(
        base_url="http://server",
        api_key="tml-key",
        route_prefix="/twinkle",
        session_heartbeat_interval=0.05,
        session_metadata={"user": "alice"},
        transport=server.transport(),
    )
    created = json.loads(server.seen[0].content)
    assert created == {"user_metadata": {"user": "alice"}, "heartbeat_interval_s": 0.05}
    assert client.session_metadata == {"user": "alice"}
    beats = server.beats(at_least=3)
    assert len(beats) >= 3
    assert all(json.loads(r.content) == {"session_id": client.session_id} for r in beats)
    client.close()
    assert server.paths()[-1] == f"/api/v1/sessions/{client.session_id}/finish"


def test_the_former_heartbeat_keyword_still_works():
    server = Scripted()
    client = TwinkleClient(api_key="tml-key", transport=server.transport(), heartbeat_interval=0.05)
    assert server.beats(at_least=1)
    client.close()


def test_constructing_a_client_sets_the_shared_context_of_the_proxies():
    server = Scripted()
    first = TwinkleClient(api_key="tml-key", transport=server.transport())
    assert get_client() is first
    assert MultiLoraTransformersModel(model_id="bundled://tiny-qwen3").client is first
    second = init_twinkle_client(api_key="tml-key", transport=server.transport())
    assert get_client() is second
    assert vLLMSampler().client is second
    assert Dataset(DatasetMeta("bundled://self-cognition")).client is second
    second.close()
    with pytest.raises(TwinkleClientError, match="no Twinkle client"):
        get_client()
    first.close()


def test_the_proxies_call_the_component_routes_under_the_route_prefix():
    server = Scripted(prefix="/team/twinkle")
    client = TwinkleClient(
        api_key="tml-key", route_prefix="/team/twinkle/", transport=server.transport()
    )
    Dataset(DatasetMeta("bundled://self-cognition"), client=client)
    vLLMSampler(client=client).set_template("Template")
    assert server.paths()[:1] == ["/api/v1/team/twinkle/api"]  # the prefix was checked first
    assert "/api/v1/team/twinkle/dataset/create" in server.paths()
    assert "/api/v1/team/twinkle/sampler/set_template" in server.paths()
    client.close()


def test_a_route_prefix_the_server_does_not_serve_is_named():
    server = Scripted(prefix="/twinkle")
    with pytest.raises(
        TwinkleClientError, match="no Twinkle routes under route_prefix='/elsewhere'"
    ):
        TwinkleClient(api_key="tml-key", route_prefix="/elsewhere", transport=server.transport())
    assert server.sessions == 0


EXIT_WITHOUT_CLOSE = """
import httpx
from twinkle_client import TwinkleClient
from twinkle_client.http import Transport

def handler(request):
    if request.url.path.endswith('/create_session'):
        return httpx.Response(200, json={'session_id': 'sess-exit'})
    print('server saw', request.url.path, flush=True)
    return httpx.Response(200, json={})

http = httpx.Client(transport=httpx.MockTransport(handler))
TwinkleClient(api_key='tml-key', transport=Transport('http://server', 'tml-key', http_client=http))
print('script ends', flush=True)
"""


def test_close_runs_at_interpreter_exit():
    done = subprocess.run(
        [sys.executable, "-c", EXIT_WITHOUT_CLOSE], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == [
        "script ends",
        "server saw /api/v1/sessions/sess-exit/finish",
    ]
