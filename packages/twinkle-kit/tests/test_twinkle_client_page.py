"""The TwinkleClient page of the user's documents (000), its samples as written, against a real
twinkle-server process on the tiny model; and the query loop of the remote-training page (004).

The documents' ids are changed to the bundled ones: the model ``Qwen/Qwen3.5-4B`` is
``tiny-qwen3`` here, ``run_abc123`` a run this test trains.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from twinkle import get_logger
from twinkle_client.dataloader import DataLoader
from twinkle_client.dataset import Dataset, DatasetMeta
from twinkle_client.errors import NotFoundError, SessionFinishedError
from twinkle_client.manager import TwinkleClient, get_client
from twinkle_client.model import MultiLoraTransformersModel
from twinkle_client.sampler import vLLMSampler

logger = get_logger()
MODEL_ID = "bundled://tiny-qwen3"
BATCH = [{"input_ids": [1, 2, 3, 4, 5, 6], "labels": [-100, -100, 3, 4, 5, 6]}]
MAX_LORAS = 8


@pytest.fixture(scope="module")
def server(server_process):
    server = server_process(
        "client-page",
        {
            "model": {"model_id": MODEL_ID, "max_loras": MAX_LORAS, "device": "cpu"},
            "sampler": {"enabled": False},
        },
    )
    keys = {name: server.cli("keys", "create", "--name", name) for name in ("alice", "bob")}
    server.start(timeout_s=180)
    yield {"url": server.url, "keys": keys}
    server.stop(timeout_s=30)


def _trained_run(name: str) -> tuple[str, str]:
    """A run of the shared context's client with one step and a checkpoint ``name``."""
    model = MultiLoraTransformersModel(model_id=MODEL_ID)
    model.add_adapter_to_model("default", {"r": 4, "target_modules": "all-linear"})
    model.set_optimizer("AdamW", lr=1e-3)
    model.forward_backward(inputs=BATCH)
    model.step()
    return model.training_run_id(), model.save(name=name)


def test_the_twinkle_client_page_runs_as_written(server):
    # 初始化
    client = TwinkleClient(
        base_url=server["url"],  # 或 TWINKLE_SERVER_URL 环境变量
        api_key=server["keys"]["alice"],  # 或 TWINKLE_SERVER_TOKEN 环境变量
        route_prefix="/twinkle",  # API 路由前缀
        session_heartbeat_interval=10,  # 心跳间隔（秒）
        session_metadata={"user": "alice"},  # 可选的会话元数据
    )
    # The page assumes a run with a checkpoint named 'checkpoint': trained through the
    # shared context the constructor set.
    run_id, saved = _trained_run("checkpoint")

    # 健康检查
    is_healthy = client.health_check()
    capabilities = client.get_server_capabilities()
    assert is_healthy is True
    assert [m["model_name"] for m in capabilities["supported_models"]] == [MODEL_ID]

    # 训练任务
    runs = client.list_training_runs(limit=20, offset=0)
    runs, cursor = client.list_training_runs_with_cursor(limit=20)
    run = client.get_training_run(run_id=run_id)
    qwen_runs = client.find_training_run_by_model("tiny-qwen3")
    assert run_id in [r.training_run_id for r in runs]
    assert (cursor.offset, cursor.limit, cursor.total_count) == (0, 20, len(runs))
    assert run.training_run_id == run_id and run.base_model == MODEL_ID
    assert run_id in [r.training_run_id for r in qwen_runs]
    assert {r.base_model for r in qwen_runs} == {MODEL_ID}

    # 检查点
    checkpoints = client.list_checkpoints(run_id=run_id)
    checkpoint_id = checkpoints[0].checkpoint_id
    parsed = client.get_checkpoint_path(run_id, checkpoint_id)
    assert (Path(parsed.path) / "adapter_model.safetensors").is_file()  # parsed.path → 文件系统路径
    assert parsed.twinkle_path == saved  # parsed.twinkle_path → twinkle:// URI
    latest_path = client.get_latest_checkpoint_path(run_id)
    assert latest_path == saved

    # 容量与权重信息
    capacity = client.get_capacity_info()
    assert (capacity.max_loras, capacity.max_loras_per_key) == (MAX_LORAS, MAX_LORAS // 2)
    assert capacity.used_loras >= 1 and capacity.free_loras <= MAX_LORAS - capacity.used_loras
    info = client.get_weights_info(f"twinkle://{run_id}/weights/checkpoint")
    assert (info.base_model, info.is_lora, info.lora_rank) == (MODEL_ID, True, 4)

    # The session metadata is stored with the session and returned by the server.
    session = client.get_session()
    assert session.user_metadata == {"user": "alice"}
    assert run_id in session.training_run_ids

    # 删除检查点
    client.delete_checkpoint(run_id, checkpoint_id)
    assert client.list_checkpoints(run_id=run_id) == []
    assert not Path(parsed.path).exists()
    assert client.get_latest_checkpoint_path(run_id) is None

    # 清理
    client.close()
    with TwinkleClient(server["url"], server["keys"]["alice"]) as after:
        assert after.get_capacity_info().used_loras == capacity.used_loras - 1


def test_proxies_built_after_a_client_use_it(server):
    client = TwinkleClient(base_url=server["url"], api_key=server["keys"]["alice"])
    dataset = Dataset(dataset_meta=DatasetMeta("bundled://self-cognition", data_slice=range(4)))
    dataloader = DataLoader(dataset=dataset, batch_size=2)
    model = MultiLoraTransformersModel(model_id=MODEL_ID)
    sampler = vLLMSampler(model_id=MODEL_ID)
    assert get_client() is client
    assert dataset.client is dataloader.client is model.client is sampler.client is client
    client.close()


def test_runs_page_by_cursor_and_old_keywords_still_work(server):
    client = TwinkleClient(server["url"], server["keys"]["bob"], heartbeat_interval=10)
    made = [_trained_run(f"page-{i}")[0] for i in range(3)]
    seen, offset = [], 0
    while offset is not None:
        runs, cursor = client.list_training_runs_with_cursor(limit=2, offset=offset)
        assert len(runs) <= 2
        seen += [r.training_run_id for r in runs]
        offset = cursor.next_offset
    assert seen == [r.training_run_id for r in client.list_training_runs(limit=100)]
    assert set(made) <= set(seen) and len(seen) == cursor.total_count
    assert client.get_training_run(training_run_id=made[0]).training_run_id == made[0]
    assert len(client.list_checkpoints(training_run_id=made[1])) == 1
    parsed = client.get_checkpoint_path(training_run_id=made[2], name="page-2")
    assert parsed.twinkle_path == f"twinkle://{made[2]}/weights/page-2"
    assert parsed.tinker_path == f"tinker://{made[2]}/weights/page-2"
    assert client.find_training_run_by_model(model="Qwen/Qwen3.5-4B") == []
    client.close()


def test_the_remote_training_pages_query_loop_runs_as_written(server):
    from twinkle_client import init_twinkle_client

    client = init_twinkle_client(base_url=server["url"], api_key=server["keys"]["alice"])
    _, saved = _trained_run("for-resume")
    # 查询已有训练运行和检查点
    runs = client.list_training_runs()
    resume_path = None
    for run in runs:
        logger.info(run.model_dump_json(indent=2))
        checkpoints = client.list_checkpoints(run.training_run_id)
        for checkpoint in checkpoints:
            logger.info(checkpoint.model_dump_json(indent=2))
            resume_path = checkpoint.twinkle_path
    assert resume_path == saved
    model = MultiLoraTransformersModel(model_id=MODEL_ID)
    model.add_adapter_to_model("default", {"r": 4, "target_modules": "all-linear"})
    model.set_optimizer("AdamW", lr=1e-3)
    model.load(resume_path, load_optimizer=True)
    client.close()


def test_another_keys_runs_and_checkpoints_stay_refused(server):
    owner = TwinkleClient(server["url"], server["keys"]["alice"])
    run_id, saved = _trained_run("private")
    other = TwinkleClient(server["url"], server["keys"]["bob"])
    for attempt in (
        lambda: other.get_training_run(run_id=run_id),
        lambda: other.list_checkpoints(run_id=run_id),
        lambda: other.get_checkpoint_path(run_id, "weights/private"),
        lambda: other.get_latest_checkpoint_path(run_id),
        lambda: other.get_weights_info(saved),
        lambda: other.delete_checkpoint(run_id, "weights/private"),
    ):
        with pytest.raises(NotFoundError) as info:
            attempt()
        assert info.value.status == 404 and info.value.category == "user"
    assert run_id not in [r.training_run_id for r in other.find_training_run_by_model(MODEL_ID)]
    assert owner.get_checkpoint_path(run_id, "private").twinkle_path == saved
    owner.close()
    other.close()


EXIT_WITHOUT_CLOSE = """
import sys
from twinkle_client.manager import TwinkleClient
print(TwinkleClient(base_url=sys.argv[1], api_key=sys.argv[2]).session_id)
"""


def test_a_script_that_never_calls_close_ends_its_session_at_exit(server):
    url, key = server["url"], server["keys"]["alice"]
    done = subprocess.run(
        [sys.executable, "-c", EXIT_WITHOUT_CLOSE, url, key],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    session_id = done.stdout.split()[-1]
    with TwinkleClient(url, key) as client, pytest.raises(SessionFinishedError):
        client.transport.request("POST", "/session_heartbeat", {"session_id": session_id})
