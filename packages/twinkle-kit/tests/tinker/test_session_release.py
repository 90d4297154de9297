"""Tinker scripts that end without close() do not hold their LoRA slots until the TTL.

A server of its own with 2 slots, a TTL of 10 minutes and a 1 s heartbeat grace: three SDK
scripts run one after another (each trains a step and exits without ``close()``, as the
documents' samples do), so the third needs a slot one of the first two held. A script the
server refuses follows what the refusal says (it names the seconds until a slot frees) and
tries once more. Every script must finish, the slots must all be free within a beat plus
the grace after the last one ends, and a client that keeps beating keeps its slot.

A script ends with ``os._exit``: the process stops, as the server sees any script end. Left
to the interpreter's shutdown, the SDK's daemon thread (an event loop in an HTTP client's
native runtime) was seen to abort it (SIGABRT, exit -6) on a loaded CI machine, after the
script's work was done.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import httpx
import pytest
import tinker
from tinker import types

from twinkle.server.sessions import REAP_INTERVAL_S, TINKER_SDK_HEARTBEAT_S

SLOTS = 2
GRACE_S = 1.0
TTL_S = 600.0
TIMEOUT_S = 180
RELEASE_S = TINKER_SDK_HEARTBEAT_S + GRACE_S + REAP_INTERVAL_S + 5  # + slack for a busy box
TOKENS = [3, 14, 15, 92, 65, 35, 89, 79]

SCRIPT = """
import os, re, sys, time
import tinker
from tinker import types

tokens = [3, 14, 15, 92, 65, 35, 89, 79]
datum = types.Datum(
    model_input=types.ModelInput.from_ints(tokens[:-1]),
    loss_fn_inputs={
        "target_tokens": types.TensorData(data=tokens[1:], dtype="int64", shape=[7]),
        "weights": types.TensorData(data=[1.0] * 7, dtype="float32", shape=[7]),
    },
)
service = tinker.ServiceClient(base_url=sys.argv[1], api_key=sys.argv[2])
for _ in range(int(sys.argv[4])):
    for attempt in range(2):
        try:
            training = service.create_lora_training_client(base_model=sys.argv[3], rank=4)
            training = training.result(120)
            break
        except Exception as exc:
            wait = re.search(r"LoRA slots are in use.*within (\\d+) s", str(exc))
            if wait is None or attempt:
                raise
            print(f"REFUSED {wait.group(1)}: {exc}", flush=True)
            time.sleep(int(wait.group(1)))
    training.forward_backward([datum], "cross_entropy").result(120)
    training.optim_step(types.AdamParams(learning_rate=1e-3)).result(120)
    print("TRAINED", training.model_id, flush=True)
os._exit(0)
"""  # ends without service.close(): its heartbeats stop when the process does


@pytest.fixture(scope="module")
def small_server(server_process, base_model):
    process = server_process(
        "slots_home",
        {
            "model": {"model_id": base_model, "max_loras": SLOTS, "device": "cpu"},
            "sampler": {"enabled": False},
            "limits": {
                "session_ttl_s": TTL_S,
                "session_heartbeat_grace_s": GRACE_S,
                "max_loras_per_key": SLOTS,  # one key fills the pool here
            },
        },
    )
    key = process.cli("keys", "create", "--name", "slots")
    process.start(timeout_s=240)
    yield process, key
    process.stop(timeout_s=30)


def _used_loras(url: str, key: str) -> int:
    reply = httpx.get(f"{url}/api/v1/capacity", headers={"X-API-Key": key}, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.json()["used_loras"]


def _script(url: str, key: str, base_model: str, clients: int = 1) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TINKER_TELEMETRY": "0"}
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, url, key, base_model, str(clients)],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S + 60,
    )


def test_scripts_run_one_after_another_free_their_slots(small_server, base_model):
    process, key = small_server
    runs, refusals = [], []
    for _ in range(SLOTS + 1):
        done = _script(process.url, key, base_model)
        assert done.returncode == 0, done.stdout[-1000:] + done.stderr[-3000:]
        lines = done.stdout.splitlines()
        runs += [line.split()[1] for line in lines if line.startswith("TRAINED")]
        refusals += [
            int(line.split()[1].rstrip(":")) for line in lines if line.startswith("REFUSED")
        ]
    assert len(set(runs)) == SLOTS + 1, runs
    assert all(wait <= RELEASE_S for wait in refusals), refusals  # not the 600 s TTL

    ended = time.monotonic()
    while _used_loras(process.url, key) > 0:
        assert time.monotonic() - ended < RELEASE_S, process.log_tail()
        time.sleep(0.5)


def test_a_client_that_keeps_beating_keeps_its_slot(small_server, base_model):
    process, key = small_server
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(TOKENS[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData(data=TOKENS[1:], dtype="int64", shape=[7]),
            "weights": types.TensorData(data=[1.0] * 7, dtype="float32", shape=[7]),
        },
    )
    with tinker.ServiceClient(base_url=process.url, api_key=key) as service:
        training = service.create_lora_training_client(base_model=base_model, rank=4)
        training = training.result(TIMEOUT_S)
        time.sleep(RELEASE_S)  # idle, but its SDK heartbeats every 10 s
        assert _used_loras(process.url, key) == 1
        training.forward_backward([datum], "cross_entropy").result(TIMEOUT_S)
    ended = time.monotonic()
    while _used_loras(process.url, key) > 0:  # close() finishes the session: freed at once
        assert time.monotonic() - ended < REAP_INTERVAL_S, process.log_tail()
        time.sleep(0.2)


def test_a_refused_sdk_caller_is_told_when_a_slot_frees(small_server, base_model):
    """A script takes every slot and ends; at once the next caller is refused, with the
    seconds to wait, and after them it gets a slot."""
    process, key = small_server
    done = _script(process.url, key, base_model, clients=SLOTS)
    assert done.returncode == 0, done.stdout[-1000:] + done.stderr[-3000:]
    with tinker.ServiceClient(base_url=process.url, api_key=key) as service:
        with pytest.raises(tinker.RequestFailedError) as refused:
            service.create_lora_training_client(base_model=base_model, rank=4).result(TIMEOUT_S)
        message = str(refused.value)
        match = re.search(r"all 2 LoRA slots are in use.*within (\d+) s", message)
        assert match is not None, message
        assert int(match.group(1)) <= RELEASE_S, message
        time.sleep(int(match.group(1)))
        service.create_lora_training_client(base_model=base_model, rank=4).result(TIMEOUT_S)
