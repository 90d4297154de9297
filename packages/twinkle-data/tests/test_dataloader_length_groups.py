"""DataLoader(group_by_length=True): batches of similar lengths (far less padding), every
sample once per epoch, a random order that changes per epoch and seed, the partial batch
last, exact resume, data ranks, worker processes, an encoded Dataset's length column, and
the inputs it refuses."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinkle.data_format import InputFeature
from twinkle.dataloader import DataLoader
from twinkle.dataloader.length_groups import group_by_length, sample_lengths
from twinkle.infra import reset

LENGTHS = np.random.default_rng(7).lognormal(np.log(40), 1.0, 600).astype(int).clip(1, 900)
# Sample i's first token is i, so a batch names its samples.
ROWS = [InputFeature(input_ids=[i] + [1] * (int(n) - 1)) for i, n in enumerate(LENGTHS)]


pytestmark = pytest.mark.usefixtures("single_process")


def ids(batch) -> list[int]:
    return [int(row.input_ids[0]) for row in batch]


def epoch(loader: DataLoader) -> list[list[int]]:
    return [ids(batch) for batch in loader]


def padding(batches: list[list[int]]) -> float:
    slots = sum(len(b) * LENGTHS[b].max() for b in batches)
    return 1 - sum(LENGTHS[b].sum() for b in batches) / slots


def test_grouped_batches_hold_far_less_padding_and_every_sample_once():
    plain = epoch(DataLoader(ROWS, batch_size=8, shuffle=True))
    grouped = epoch(DataLoader(ROWS, batch_size=8, shuffle=True, group_by_length=True))
    assert sorted(sum(grouped, [])) == list(range(len(ROWS)))
    assert padding(plain) > 0.5 and padding(grouped) < 0.25 * padding(plain)


def test_the_order_is_random_per_epoch_and_seed_but_rebuilt_alike():
    def loader(seed: int) -> DataLoader:
        return DataLoader(ROWS, batch_size=8, shuffle=True, seed=seed, group_by_length=True)

    first = loader(1)
    epochs = [epoch(first), epoch(first)]
    assert epochs[0] != epochs[1]
    assert epoch(loader(1)) == epochs[0] and epoch(loader(2)) != epochs[0]
    # Not sorted across the epoch: the longest batches are spread, not all first.
    longest = [LENGTHS[b].max() for b in epochs[0]]
    assert longest != sorted(longest, reverse=True)


def test_without_shuffle_each_window_is_sorted_longest_first():
    batches = epoch(DataLoader(ROWS[:64], batch_size=8, group_by_length=True))
    flat = LENGTHS[sum(batches, [])]
    assert list(flat) == sorted(flat, reverse=True)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 300),
    batch_size=st.integers(1, 17),
    shuffle=st.booleans(),
    steps_before=st.integers(0, 30),
)
def test_resume_is_exact_and_the_partial_batch_stays_last(n, batch_size, shuffle, steps_before):
    def loader() -> DataLoader:
        return DataLoader(
            ROWS[:n], batch_size=batch_size, shuffle=shuffle, group_by_length=True, min_batch_size=1
        )

    whole = loader()
    uninterrupted = epoch(whole) + epoch(whole)
    assert all(len(b) == batch_size for b in uninterrupted[: len(uninterrupted) // 2 - 1])
    steps_before = min(steps_before, len(uninterrupted))
    first = loader()
    before = []
    while len(before) < steps_before:
        for batch in first:
            before.append(ids(batch))
            if len(before) == steps_before:
                break
    resumed = loader()
    resumed.resume_from_checkpoint(first.get_state()["consumed_train_samples"])
    after = []
    while len(before) + len(after) < len(uninterrupted):
        after.extend(ids(batch) for batch in resumed)
    assert before + after[: len(uninterrupted) - len(before)] == uninterrupted


def test_two_data_ranks_split_the_same_grouped_batches(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    shares = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        reset()
        shares.append(epoch(DataLoader(ROWS, batch_size=8, shuffle=True, group_by_length=True)))
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    reset()
    whole = epoch(DataLoader(ROWS, batch_size=8, shuffle=True, group_by_length=True))
    assert [a + b for a, b in zip(*shares, strict=True)] == whole


def test_worker_processes_give_the_same_grouped_batches():
    rows = ROWS[:48]
    inline = epoch(DataLoader(rows, batch_size=8, shuffle=True, group_by_length=True))
    workers = DataLoader(rows, batch_size=8, shuffle=True, group_by_length=True, num_workers=1)
    assert epoch(workers) == inline


def test_an_encoded_dataset_gives_its_length_column():
    from twinkle.dataset import Dataset, DatasetMeta
    from twinkle.preprocessor import SelfCognitionProcessor

    dataset = Dataset(DatasetMeta("bundled://self-cognition", data_slice=range(20)))
    dataset.set_template("Qwen3_5Template", model_id="bundled://tiny-qwen3")
    dataset.map(SelfCognitionProcessor("Twinkle", "the Twinkle team"))
    dataset.encode()
    lengths = sample_lengths(dataset)
    assert lengths.tolist() == [len(dataset[i]["input_ids"]) for i in range(20)]
    batches = list(DataLoader(dataset, batch_size=4, shuffle=True, group_by_length=True))
    assert sum(len(b) for b in batches) == 20


def test_group_by_length_keeps_the_tail_in_place():
    order = np.arange(10)
    grouped = group_by_length(order, np.arange(10), batch_size=4, rng=None)
    assert grouped.tolist() == [7, 6, 5, 4, 3, 2, 1, 0, 8, 9]


def test_bad_inputs_name_the_problem():
    with pytest.raises(TypeError, match="group_by_length must be True or False"):
        DataLoader(ROWS, batch_size=4, group_by_length="yes")
    with pytest.raises(ValueError, match="group_by_length=True needs a map-style dataset"):
        DataLoader(iter_again(ROWS), batch_size=4, group_by_length=True)
    with pytest.raises(ValueError, match="sample 0 has no input_ids.*dataset.encode"):
        DataLoader([{"messages": []}] * 4, batch_size=2, group_by_length=True)


class iter_again:  # noqa: N801 - a tiny stream: re-iterable, no length
    def __init__(self, rows) -> None:
        self.rows = rows

    def __iter__(self):
        return iter(self.rows)
