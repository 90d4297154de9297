"""The client against a real twinkle-server process on 127.0.0.1 with the tiny model.

Lives in twinkle-kit, whose environment has the server: the server is started as
a process (``python -m twinkle.server``), never imported, so the client keeps no
dependency on it; the torch-free client tests live in packages/twinkle-client/tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from twinkle_client import TwinkleClient
from twinkle_client.api import REMOTE_API
from twinkle_client.errors import AuthenticationError, NotFoundError
from twinkle_client.model import MultiLoraTransformersModel
from twinkle_client.sampler import vLLMSampler

SFT_BATCH = [
    {"input_ids": [1, 2, 3, 4, 5, 6, 7], "labels": [-100, -100, 3, 4, 5, 6, 7]},
    {"input_ids": [9, 8, 7, 6, 5], "labels": [-100, 8, 7, 6, 5]},
]
PROMPTS = [{"messages": [{"role": "user", "content": f"What is {i} + {i}?"}]} for i in range(2)]
LORA = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": "all-linear"}
STEPS = 3


@pytest.fixture(scope="module")
def server(server_process):
    server = server_process(
        "home",
        {
            "model": {"model_id": "bundled://tiny-qwen3", "max_loras": 8, "device": "cpu"},
            "sampler": {"enabled": True, "kind": "torch"},
        },
    )
    keys = {name: server.cli("keys", "create", "--name", name) for name in ("sft", "grpo", "gone")}
    server.start(timeout_s=180)
    yield {"url": server.url, "keys": keys, "home": server.home, "cli": server.cli}
    server.stop(timeout_s=30)


def _weights(home: Path, uri: str) -> dict[str, np.ndarray]:
    run, _, name = uri.removeprefix("twinkle://").partition("/weights/")
    (folder,) = home.glob(f"checkpoints/*/{run.replace(':', '_')}/weights/{name}")
    return load_file(str(folder / "adapter_model.safetensors"))


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_allclose(a[key], b[key], rtol=0, atol=1e-6, err_msg=key)


def _sft_steps(model: MultiLoraTransformersModel) -> None:
    for _ in range(STEPS):
        model.forward_backward(inputs=SFT_BATCH)
        model.clip_grad_norm(1.0)
        model.step()
        model.zero_grad()


def _grpo_steps(model: MultiLoraTransformersModel, features, old_logps, advantages) -> None:
    for _ in range(STEPS):
        model.forward_backward(inputs=features, old_logps=old_logps, advantages=advantages)
        model.clip_grad_norm(1.0)
        model.step()
        model.zero_grad()


def _new_model(client: TwinkleClient, loss: str | None = None) -> MultiLoraTransformersModel:
    model = MultiLoraTransformersModel(model_id="bundled://tiny-qwen3", client=client)
    model.add_adapter_to_model("default", LORA)
    if loss is not None:
        model.set_loss(loss, epsilon=0.2, beta=0.0)
    model.set_optimizer("AdamW", lr=1e-2)
    return model


def test_the_proxies_table_is_the_servers(server):
    with TwinkleClient(server["url"], server["keys"]["sft"]) as client:
        assert client.get_remote_api() == REMOTE_API


def test_two_tenants_train_concurrently_and_each_adapter_moves_only_by_its_own_requests(server):
    sft = TwinkleClient(server["url"], server["keys"]["sft"])
    grpo = TwinkleClient(server["url"], server["keys"]["grpo"])
    home = server["home"]

    # GRPO tenant: completions from the server's sampler, with their logprobs.
    sampler = vLLMSampler("bundled://tiny-qwen3", client=grpo)
    sampled = sampler.sample(PROMPTS, {"max_tokens": 6, "seed": 1}, num_samples=2)
    sequences = sampled["sequences"]
    assert len(sequences) == 4 and len(sampled["responses"]) == 2
    features = [seq.new_input_feature for seq in sequences]
    old_logps = [[pairs[0][1] for pairs in seq.logprobs] for seq in sequences]
    advantages = [1.0, -1.0, 0.5, -0.5]

    a = _new_model(sft)
    b = _new_model(grpo, "GRPOLoss")
    a_init, b_init = a.save("init", save_optimizer=False), b.save("init", save_optimizer=False)

    errors = []

    def run(fn, *args):
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=(_sft_steps, a)),
        threading.Thread(target=run, args=(_grpo_steps, b, features, old_logps, advantages)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    a_after, b_after = a.save("after"), b.save("after")

    # Each tenant replays its own steps alone, from the same start: identical weights, so the
    # other tenant's interleaved requests changed nothing of its adapter.
    a2, b2 = _new_model(sft), _new_model(grpo, "GRPOLoss")
    a2.load(a_init)
    b2.load(b_init)
    _sft_steps(a2)
    _grpo_steps(b2, features, old_logps, advantages)
    _assert_same(_weights(home, a_after), _weights(home, a2.save("replay")))
    _assert_same(_weights(home, b_after), _weights(home, b2.save("replay")))
    for init, after in ((a_init, a_after), (b_init, b_after)):
        moved = _weights(home, init)
        assert any(not np.allclose(moved[k], v) for k, v in _weights(home, after).items())

    # Sampling from a saved adapter works for its owner.
    tuned = sampler.sample(PROMPTS[:1], {"max_tokens": 4, "seed": 1}, adapter_uri=b_after)
    assert len(tuned["sequences"]) == 1
    sft.close()
    grpo.close()


def test_a_tenant_cannot_reach_another_tenants_runs_or_checkpoints(server):
    owner = TwinkleClient(server["url"], server["keys"]["sft"])
    other = TwinkleClient(server["url"], server["keys"]["grpo"])
    model = _new_model(owner)
    _sft_steps(model)
    path = model.save("private")
    run_id = model.training_run_id()

    assert run_id in [r.training_run_id for r in owner.list_training_runs(limit=100)]
    assert owner.get_checkpoint_path(run_id, "private").twinkle_path == path
    assert owner.get_latest_checkpoint_path(run_id) == path
    assert owner.get_weights_info(path).lora_rank == 4
    runs = owner.find_training_run_by_model("bundled://tiny-qwen3")
    assert run_id in [r.training_run_id for r in runs]
    assert run_id not in [r.training_run_id for r in other.list_training_runs(limit=100)]
    thief = _new_model(other)
    for attempt in (
        lambda: other.get_training_run(run_id),
        lambda: other.list_checkpoints(run_id),
        lambda: other.delete_checkpoint(path),
        lambda: other.get_weights_info(path),
        lambda: thief.load(path),
        lambda: vLLMSampler(client=other).sample(PROMPTS[:1], {"max_tokens": 2}, adapter_uri=path),
    ):
        with pytest.raises(NotFoundError):
            attempt()
    assert [c.twinkle_path for c in owner.list_checkpoints(run_id)] == [path]
    owner.delete_checkpoint(path)
    assert owner.list_checkpoints(run_id) == []
    before = owner.get_capacity_info()
    owner.close()
    other.close()
    # This key's own slots (the thief's is not shown to it), and its quota: ceil(8 / 2).
    assert before.used_loras >= 1 and before.max_loras_per_key == 4


def test_a_revoked_key_stops_working_and_others_continue(server):
    client = TwinkleClient(server["url"], server["keys"]["gone"])
    assert client.health_check()
    server["cli"]("keys", "revoke", "gone")
    with pytest.raises(AuthenticationError):
        client.list_training_runs()
    with TwinkleClient(server["url"], server["keys"]["sft"]) as still_fine:
        assert isinstance(still_fine.list_training_runs(), list)


SFT_LOOP = """
import importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {'torch', 'transformers', 'peft', 'datasets'}:
            raise ImportError(f'{name} is blocked')
        return None

sys.meta_path.insert(0, Block())
from twinkle_client import init_twinkle_client
from twinkle_client.dataloader import DataLoader
from twinkle_client.dataset import Dataset, DatasetMeta
from twinkle_client.model import MultiLoraTransformersModel

client = init_twinkle_client(base_url=sys.argv[1], api_key=sys.argv[2])
dataset = Dataset(dataset_meta=DatasetMeta('bundled://self-cognition', data_slice=range(8)))
dataset.set_template('Template', model_id='bundled://tiny-qwen3', max_length=128)
dataset.map('SelfCognitionProcessor', init_args={'model_name': 'tw', 'model_author': 'us'})
dataset.encode(batched=True)
dataloader = DataLoader(dataset=dataset, batch_size=4)
model = MultiLoraTransformersModel(model_id='bundled://tiny-qwen3')
model.add_adapter_to_model('default', {'r': 4, 'target_modules': 'all-linear'})
model.set_template('Template')
model.set_processor('InputProcessor', padding_side='right')
model.set_loss('CrossEntropyLoss')
model.set_optimizer('AdamW', lr=1e-3)
model.set_lr_scheduler('LinearLR')
losses = []
for batch in dataloader:
    losses.append(model.forward_backward(inputs=batch).loss)
    model.clip_grad_norm(1.0); model.step(); model.zero_grad(); model.lr_step()
print(len(losses), model.save(name='no-torch'))
client.close()
"""


def test_a_torch_free_client_runs_a_remote_sft_loop(server):
    done = subprocess.run(
        [sys.executable, "-c", SFT_LOOP, server["url"], server["keys"]["sft"]],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    steps, path = done.stdout.split()[-2:]
    assert steps == "2" and path.startswith("twinkle://") and path.endswith("/weights/no-torch")


COOKBOOK = Path(__file__).resolve().parents[3] / "cookbook" / "client" / "twinkle"


@pytest.mark.parametrize(
    ("script", "args", "expect"),
    [
        ("sft.py", ["--epochs", "1", "--rows", "8"], "Saved checkpoint: twinkle://"),
        (
            "grpo.py",
            ["--max-steps", "1", "--max-new-tokens", "8"],
            "Saved final checkpoint: twinkle://",
        ),
    ],
)
def test_the_client_cookbook_runs_against_the_server(server, script, args, expect):
    env = {
        **os.environ,
        "TWINKLE_SERVER_TOKEN": server["keys"]["sft"],
        "TWINKLE_SERVER_URL": server["url"],
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, str(COOKBOOK / script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert expect in done.stderr + done.stdout
