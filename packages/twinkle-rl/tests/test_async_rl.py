"""AsyncRollouts: the staleness bound holds whatever the timing, a batch staler than k is
never trained on, the producer's failure reaches the trainer, and k = 0 is the synchronous
loop call for call, so a real GRPO run gives the same losses as the plain loop."""

import random
import threading
import time

import pytest

from twinkle.checkpoint_engine import CheckpointEngineManager
from twinkle.data_format import SamplingParams
from twinkle.env import ArithmeticToolEnv, task_row
from twinkle.model import TransformersModel
from twinkle.rollout import AsyncRollouts, MultiTurnRollout
from twinkle.sampler import TorchSampler

MODEL_ID = "bundled://tiny-qwen3"


class Recorder:
    """produce/sync callables that log what ran, in order, with the version seen."""

    def __init__(self, delays=(0.0, 0.0), seed=0):
        self.events, self.lock = [], threading.Lock()
        self.rollouts: AsyncRollouts | None = None
        self.started = threading.Event()  # the producer reads the version once it is set
        self.rng, self.delays = random.Random(seed), delays

    def produce(self, index):
        self.started.wait()
        time.sleep(self.rng.uniform(*self.delays))
        with self.lock:
            self.events.append(("produce", index, self.rollouts.version))
        return f"batch {index}"

    def sync(self):
        with self.lock:
            self.events.append(("sync", self.rollouts.version))


def start(recorder, max_staleness, num_batches):
    rollouts = AsyncRollouts(
        recorder.produce, recorder.sync, max_staleness, num_batches=num_batches
    )
    recorder.rollouts = rollouts
    recorder.started.set()
    return rollouts


def test_staleness_zero_is_sample_train_sync_in_turn():
    recorder = Recorder()
    with start(recorder, 0, 4) as rollouts:
        for step in range(4):
            batch = rollouts.next_batch()
            assert (batch.index, batch.version, batch.staleness) == (step, step, 0)
            rollouts.publish()
        with pytest.raises(StopIteration):
            rollouts.next_batch()
    expected = []
    for step in range(4):
        expected += [("produce", step, step), ("sync", step)]
    assert recorder.events == expected


@pytest.mark.parametrize("max_staleness", [1, 2])
def test_the_producer_runs_ahead_by_at_most_k_versions(max_staleness):
    recorder = Recorder(delays=(0.0, 0.004), seed=max_staleness)
    seen = []
    with start(recorder, max_staleness, 12) as rollouts:
        for _ in range(12):
            batch = rollouts.next_batch()
            seen.append(batch)
            time.sleep(random.Random(batch.index).uniform(0, 0.004))  # the "training"
            rollouts.publish()
    assert [b.index for b in seen] == list(range(12)) and rollouts.dropped == 0
    assert all(0 <= b.staleness <= max_staleness for b in seen)
    assert all(b.version >= b.index - max_staleness for b in seen)
    assert max(b.staleness for b in seen) >= 1  # it did run ahead: the overlap


def test_a_batch_staler_than_k_is_dropped_never_trained_on():
    made = threading.Event()

    def produce(index):
        if index == 1:
            made.set()
        return index

    with AsyncRollouts(produce, lambda: None, 1, num_batches=3) as rollouts:
        assert rollouts.next_batch().index == 0
        assert made.wait(10)
        while len(rollouts._ready) < 1:
            time.sleep(0.001)
        rollouts.publish()
        rollouts.publish()  # two optimizer steps on batch 0: batch 1 is now 2 versions old
        batch = rollouts.next_batch()
    assert batch.index == 2 and batch.staleness <= 1 and rollouts.dropped == 1


def test_the_producers_failure_reaches_the_trainer():
    def produce(index):
        raise ValueError("the env service is down")

    failing = pytest.raises(RuntimeError, match="producer failed.*env service is down")
    with AsyncRollouts(produce, lambda: None, 1) as rollouts, failing:
        rollouts.next_batch(timeout_s=10)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1"])
def test_max_staleness_must_be_a_count(bad):
    with pytest.raises(ValueError, match="max_staleness must be an int >= 0"):
        AsyncRollouts(lambda i: i, lambda: None, bad)


def grpo_losses(max_staleness, steps=2):
    """A tiny agentic GRPO run: the plain loop (None) or through AsyncRollouts."""
    model = TransformersModel(model_id=MODEL_ID)
    model.set_template("Qwen3_5Template")
    model.set_loss("GRPOLoss")
    model.set_optimizer("AdamW", lr=1e-2)
    sampler = TorchSampler(MODEL_ID, seed=3)
    sampler.set_template("Qwen3_5Template")
    sync = CheckpointEngineManager(model=model, sampler=sampler)
    sync.sync_weights(merge_and_sync=True)
    rollout = MultiTurnRollout(
        sampler,
        sampler.template,
        ArithmeticToolEnv,
        max_turns=2,
        sampling_params=SamplingParams(max_tokens=6, temperature=1.0),
    )
    tasks = [task_row(3, 4), task_row(5, 6)]

    def produce(index):
        return rollout(tasks, num_samples=2)

    def train(trajectories):
        # Rewards of a random model are all 0: a fixed spread keeps the gradient non-zero.
        advantages = [1.0, -1.0, 0.5, -0.5]
        output = model.forward_backward(
            inputs=[t.input_feature() for t in trajectories],
            old_logps=[t.sampled_logprobs() for t in trajectories],
            advantages=advantages,
        )
        model.clip_grad_and_step()
        metrics = model.calculate_metric(is_training=True)
        ratios.append((metrics["policy/ratio_min"], metrics["policy/ratio_max"]))
        return float(output.loss)

    def publish():
        sync.sync_weights(merge_and_sync=True)

    losses, ratios, staleness = [], [], []
    if max_staleness is None:
        for step in range(steps):
            losses.append(train(produce(step)))
            publish()
        return losses, ratios, [0] * steps
    with AsyncRollouts(produce, publish, max_staleness, num_batches=steps) as rollouts:
        for _ in range(steps):
            batch = rollouts.next_batch()
            staleness.append(batch.staleness)
            losses.append(train(batch.data))
            rollouts.publish()
    return losses, ratios, staleness


def test_staleness_zero_gives_the_synchronous_results_exactly():
    plain, _, _ = grpo_losses(None)
    assert grpo_losses(0)[0] == plain
    assert plain[0] != plain[1]


def test_a_stale_batch_is_weighed_against_the_weights_that_sampled_it():
    """With k = 1 the second batch was sampled before the first step: the loss's importance
    ratio against the sampler's logprobs leaves 1 there (and is reported), not on the first."""
    _, ratios, staleness = grpo_losses(1)
    assert staleness == [0, 1]
    (low0, high0), (low1, high1) = ratios
    assert abs(low0 - 1) < 1e-4 and abs(high0 - 1) < 1e-4
    assert low1 < 0.99 or high1 > 1.01


def test_a_paused_sampler_starts_no_batch():
    made = []
    with AsyncRollouts(made.append, lambda: None, 5, num_batches=50) as rollouts:
        with rollouts.sampler_paused():
            count = len(made)
            time.sleep(0.05)
            assert len(made) == count
        rollouts.next_batch(timeout_s=10)
