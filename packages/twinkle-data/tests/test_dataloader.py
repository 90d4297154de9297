"""DataLoader: global batches, data-rank shares, epochs, partial batches and exact resume.

Every sample is an InputFeature whose input_ids hold its index, so a batch reads
back as the list of sample ids it carries.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinkle.data_format import InputFeature
from twinkle.dataloader import DEFAULT_SEED, DataLoader
from twinkle.infra import RemoteClassSpec
from twinkle.infra.state import set_state
from twinkle.mesh import DeviceMesh
from twinkle.processor import InputProcessor

ROWS = [InputFeature(input_ids=[i]) for i in range(64)]


def rows(n: int) -> list[InputFeature]:
    return ROWS[:n]


def ids(batch: list[InputFeature]) -> list[int]:
    return [int(feature.input_ids[0]) for feature in batch]


def take(loader: DataLoader, steps: int) -> list[list[int]]:
    """The sample ids of the next ``steps`` batches, running as many epoch loops as needed."""
    out: list[list[int]] = []
    while len(out) < steps:
        for batch in loader:
            out.append(ids(batch))
            if len(out) == steps:
                break
    return out


class Stream:
    """A streaming dataset: re-iterable, no length, no indexing."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.passes = 0

    def __iter__(self):
        self.passes += 1
        return iter(rows(self.n))


pytestmark = pytest.mark.usefixtures("single_process")


def as_rank(monkeypatch, rank: int, world_size: int) -> None:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world_size))


# ---- batches and epochs -------------------------------------------------------------------


def test_batches_follow_the_dataset_and_len_counts_them():
    loader = DataLoader(rows(10), batch_size=4)
    assert len(loader) == 3
    assert [ids(b) for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert loader.get_state() == {"consumed_train_samples": 10, "epoch": 1, "seed": DEFAULT_SEED}


def test_yields_the_rows_the_dataset_returns():
    loader = DataLoader(rows(4), batch_size=2)
    batch = next(iter(loader))
    assert isinstance(batch, list)
    assert batch[0] is ROWS[0] and batch[1] is ROWS[1]


def test_each_for_loop_is_one_epoch_and_shuffles_anew():
    loader = DataLoader(rows(12), batch_size=4, shuffle=True)
    epochs = [[i for batch in loader for i in ids(batch)] for _ in range(3)]
    assert all(sorted(epoch) == list(range(12)) for epoch in epochs)
    assert epochs[0] != epochs[1] != epochs[2]
    assert loader.get_state()["epoch"] == 3


def test_shuffle_order_is_a_function_of_seed_and_epoch():
    def first_epochs(seed: int) -> list[list[int]]:
        loader = DataLoader(rows(16), batch_size=16, shuffle=True, seed=seed)
        return take(loader, 2)

    assert first_epochs(7) == first_epochs(7)
    assert first_epochs(7) != first_epochs(8)
    # (seed, epoch) pairs, not seed + epoch: seed 8's first epoch is not seed 7's second.
    assert first_epochs(8)[0] != first_epochs(7)[1]


def test_break_after_the_last_batch_still_starts_the_next_epoch_in_full():
    loader = DataLoader(rows(8), batch_size=4)
    for step, _ in enumerate(loader):
        if step == 1:
            break
    assert loader.get_state()["epoch"] == 1
    assert [ids(b) for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_a_new_for_loop_after_break_continues_mid_epoch():
    loader = DataLoader(rows(12), batch_size=4)
    for _ in loader:
        break
    assert [ids(b) for b in loader] == [[4, 5, 6, 7], [8, 9, 10, 11]]


# ---- partial batches ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]),
        ({"min_batch_size": 2}, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]),
        ({"min_batch_size": 3}, [[0, 1, 2, 3], [4, 5, 6, 7]]),
        ({"drop_last": True}, [[0, 1, 2, 3], [4, 5, 6, 7]]),
        ({"drop_last": True, "min_batch_size": 4}, [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ],
)
def test_final_partial_batch_is_kept_unless_smaller_than_min_batch_size(kwargs, expected):
    loader = DataLoader(rows(10), batch_size=4, **kwargs)
    assert len(loader) == len(expected)
    assert take(loader, 2 * len(expected)) == expected + expected


def test_min_batch_size_defaults_to_the_data_world(monkeypatch):
    as_rank(monkeypatch, 0, 4)
    mesh = DeviceMesh.from_sizes(dp_size=4, device_type="cpu")
    # 11 = 8 + 3: three samples cannot give each of the 4 data ranks one, so they are dropped.
    assert len(DataLoader(rows(11), batch_size=8, device_mesh=mesh)) == 1
    assert len(DataLoader(rows(12), batch_size=8, device_mesh=mesh)) == 2


# ---- resume -------------------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize(
    ("min_batch_size", "steps_before", "consumed", "epoch"),
    [
        (None, 1, 4, 0),  # mid-epoch
        (None, 3, 10, 1),  # epoch boundary, after a kept partial batch
        (None, 5, 18, 1),  # past the end of epoch 0: a later epoch
        (4, 2, 8, 1),  # epoch boundary, the partial batch dropped
        (4, 7, 28, 3),  # several epochs on
    ],
)
def test_resume_continues_exactly_like_the_uninterrupted_run(
    shuffle, min_batch_size, steps_before, consumed, epoch
):
    def loader() -> DataLoader:
        return DataLoader(rows(10), batch_size=4, min_batch_size=min_batch_size, shuffle=shuffle)

    total_steps = steps_before + 6
    uninterrupted = take(loader(), total_steps)

    first = loader()
    before = take(first, steps_before)
    state = first.get_state()
    assert state == {"consumed_train_samples": consumed, "epoch": epoch, "seed": DEFAULT_SEED}
    resumed = loader()
    resumed.resume_from_checkpoint(state["consumed_train_samples"])
    assert resumed.get_state() == state
    assert before + take(resumed, total_steps - steps_before) == uninterrupted


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 40),
    batch_size=st.integers(1, 9),
    min_fraction=st.floats(0, 1),
    shuffle=st.booleans(),
    steps_before=st.integers(0, 12),
)
def test_resume_after_any_number_of_steps_is_exact(
    n, batch_size, min_fraction, shuffle, steps_before
):
    min_batch_size = max(1, round(min_fraction * batch_size))
    if n < min_batch_size:
        return

    def loader() -> DataLoader:
        return DataLoader(rows(n), batch_size, min_batch_size=min_batch_size, shuffle=shuffle)

    uninterrupted = take(loader(), steps_before + 5)
    first = loader()
    before = take(first, steps_before)
    resumed = loader()
    resumed.resume_from_checkpoint(first.get_state()["consumed_train_samples"])
    assert before + take(resumed, 5) == uninterrupted
    assert (
        sum(map(len, uninterrupted[:steps_before])) == first.get_state()["consumed_train_samples"]
    )


def test_resume_replaces_the_current_position():
    loader = DataLoader(rows(12), batch_size=4)
    take(loader, 2)
    loader.resume_from_checkpoint(4)
    assert take(loader, 2) == [[4, 5, 6, 7], [8, 9, 10, 11]]
    loader.resume_from_checkpoint(0)
    assert take(loader, 1) == [[0, 1, 2, 3]]


@pytest.mark.parametrize(
    ("consumed", "error", "words"),
    [
        (5, ValueError, ["consumed_train_samples=5", "batch boundary", "batch_size=4"]),
        (13, ValueError, ["sample 3 of epoch 1", "another batch_size"]),
        (-4, ValueError, ["consumed_train_samples must be >= 0"]),
        (4.0, TypeError, ["must be an int"]),
        (True, TypeError, ["must be an int"]),
    ],
)
def test_resume_rejects_counts_this_loader_could_not_have_reached(consumed, error, words):
    loader = DataLoader(rows(10), batch_size=4)
    with pytest.raises(error) as info:
        loader.resume_from_checkpoint(consumed)
    assert all(word in str(info.value) for word in words), str(info.value)
    assert loader.get_state()["consumed_train_samples"] == 0


# ---- data ranks ---------------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [False, True])
def test_two_data_ranks_split_every_global_batch(monkeypatch, shuffle):
    mesh = DeviceMesh.from_sizes(dp_size=2, device_type="cpu")
    global_batches = take(DataLoader(rows(15), batch_size=6, shuffle=shuffle), 6)
    per_rank = {}
    for rank in (0, 1):
        as_rank(monkeypatch, rank, 2)
        loader = DataLoader(rows(15), batch_size=6, device_mesh=mesh, shuffle=shuffle)
        assert len(loader) == 3
        per_rank[rank] = take(loader, 6)
        assert loader.get_state()["consumed_train_samples"] == 30
    for step, batch in enumerate(global_batches):
        assert per_rank[0][step] + per_rank[1][step] == batch
    # The final batch of 3 is shared 2 + 1: the lowest data rank takes the remainder.
    assert [len(per_rank[0][2]), len(per_rank[1][2])] == [2, 1]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("steps_before", [1, 3, 4])
def test_two_data_ranks_resume_exactly(monkeypatch, shuffle, steps_before):
    mesh = DeviceMesh.from_sizes(dp_size=2, device_type="cpu")

    def loader() -> DataLoader:
        return DataLoader(rows(15), batch_size=6, device_mesh=mesh, shuffle=shuffle)

    for rank in (0, 1):
        as_rank(monkeypatch, rank, 2)
        uninterrupted = take(loader(), steps_before + 4)
        first = loader()
        before = take(first, steps_before)
        resumed = loader()
        resumed.resume_from_checkpoint(first.get_state()["consumed_train_samples"])
        assert before + take(resumed, 4) == uninterrupted


def test_tensor_parallel_peers_read_the_same_share(monkeypatch):
    mesh = DeviceMesh.from_sizes(dp_size=2, tp_size=2, device_type="cpu")
    shares = []
    for rank in range(4):
        as_rank(monkeypatch, rank, 4)
        shares.append(take(DataLoader(rows(8), batch_size=4, device_mesh=mesh), 2))
    assert shares[0] == shares[1] == [[0, 1], [4, 5]]
    assert shares[2] == shares[3] == [[2, 3], [6, 7]]


def test_global_mesh_from_initialize_is_the_default(monkeypatch):
    as_rank(monkeypatch, 1, 2)
    mesh = DeviceMesh.from_sizes(dp_size=2, device_type="cpu")
    set_state(mode="local", device_groups=[], global_device_mesh=mesh, lazy_collect=True)
    loader = DataLoader(rows(8), batch_size=4)
    assert loader.device_mesh is mesh
    assert take(loader, 2) == [[2, 3], [6, 7]]


def test_without_a_mesh_the_processes_of_the_launch_are_the_data_ranks(monkeypatch):
    as_rank(monkeypatch, 1, 2)
    assert take(DataLoader(rows(8), batch_size=4), 2) == [[2, 3], [6, 7]]


def test_outside_local_mode_the_whole_global_batch_is_yielded(monkeypatch):
    as_rank(monkeypatch, 1, 2)
    mesh = DeviceMesh.from_sizes(dp_size=2, device_type="cpu")
    set_state(mode="ray", device_groups=[], global_device_mesh=None, lazy_collect=True)
    loader = DataLoader(rows(8), batch_size=4, device_mesh=mesh)
    assert take(loader, 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]


# ---- factories, collation, workers, remote marks -----------------------------------------


def test_a_factory_is_called_once_to_build_the_dataset(monkeypatch):
    calls = []

    def create_dataset() -> list[InputFeature]:
        calls.append(1)
        return rows(8)

    as_rank(monkeypatch, 0, 2)
    mesh = DeviceMesh.from_sizes(world_size=2, dp_size=2, device_type="cpu")
    # The call shape of the user's Ray GRPO example.
    loader = DataLoader(
        dataset=create_dataset,
        batch_size=4,
        min_batch_size=4,
        device_mesh=mesh,
        remote_group="model",
    )
    assert calls == [1]
    assert loader.remote_group == "model"
    assert take(loader, 2) == [[0, 1], [4, 5]]


def test_collate_turns_each_share_into_tensors():
    loader = DataLoader(rows(4), batch_size=2, collate=InputProcessor(pad_token_id=0))
    batch = next(iter(loader))
    assert batch["input_ids"].tolist() == [[0], [1]]


def test_worker_processes_give_the_same_batches_and_resume_exactly():
    def loader(num_workers: int) -> DataLoader:
        return DataLoader(rows(10), batch_size=3, shuffle=True, num_workers=num_workers)

    uninterrupted = take(loader(0), 6)
    with_workers = loader(2)
    before = take(with_workers, 2)
    assert before == uninterrupted[:2]
    resumed = loader(2)
    resumed.resume_from_checkpoint(with_workers.get_state()["consumed_train_samples"])
    assert before + take(resumed, 4) == uninterrupted


def test_dataloader_is_a_remote_component():
    assert DataLoader.__twinkle_remote_class__ == RemoteClassSpec(execute="first")
    for name in ("__iter__", "__next__", "__len__", "get_state", "resume_from_checkpoint"):
        assert getattr(DataLoader, name).__twinkle_remote__.execute == "first"


# ---- streams ------------------------------------------------------------------------------


def test_a_stream_is_read_in_order_pass_after_pass():
    stream = Stream(10)
    loader = DataLoader(stream, batch_size=4)
    assert take(loader, 6) == take(DataLoader(rows(10), batch_size=4), 6)
    assert stream.passes == 2
    with pytest.raises(TypeError, match="no length"):
        len(loader)


@pytest.mark.parametrize(("n", "steps_before"), [(10, 1), (10, 3), (8, 2), (8, 3), (9, 2)])
def test_a_stream_resumes_exactly(n, steps_before):
    def loader() -> DataLoader:
        return DataLoader(Stream(n), batch_size=4, min_batch_size=2)

    uninterrupted = take(loader(), steps_before + 4)
    first = loader()
    before = take(first, steps_before)
    resumed = loader()
    resumed.resume_from_checkpoint(first.get_state()["consumed_train_samples"])
    # A pass of 8 ends exactly after batch 2; the first loop after resuming is not empty.
    assert [ids(b) for b in resumed] != []
    resumed.resume_from_checkpoint(first.get_state()["consumed_train_samples"])
    assert before + take(resumed, 4) == uninterrupted


def test_a_stream_rejects_counts_inside_a_batch():
    loader = DataLoader(Stream(10), batch_size=4)
    with pytest.raises(ValueError, match="consumed_train_samples=6 does not fall on a batch"):
        loader.resume_from_checkpoint(6)


# ---- bad inputs ---------------------------------------------------------------------------


def test_batch_size_smaller_than_the_data_world_names_both_and_the_fix(monkeypatch):
    as_rank(monkeypatch, 0, 4)
    mesh = DeviceMesh.from_sizes(dp_size=4, device_type="cpu")
    with pytest.raises(ValueError) as info:
        DataLoader(rows(8), batch_size=2, device_mesh=mesh)
    message = str(info.value)
    assert "batch_size=2" in message and "data world size 4" in message
    assert "use batch_size >= 4" in message


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch_size": 0}, ValueError, "batch_size must be >= 1"),
        ({"batch_size": -3}, ValueError, "batch_size must be >= 1"),
        ({"batch_size": 2.0}, TypeError, "batch_size must be an int"),
        ({"batch_size": True}, TypeError, "batch_size must be an int"),
        ({"batch_size": 4, "min_batch_size": 5}, ValueError, "min_batch_size=5 must lie"),
        ({"batch_size": 4, "min_batch_size": 0}, ValueError, "min_batch_size must be >= 1"),
        ({"batch_size": 4, "drop_last": True, "min_batch_size": 2}, ValueError, "drop_last"),
        ({"batch_size": 4, "seed": -1}, ValueError, "seed must be >= 0"),
        ({"batch_size": 4, "shuffle": 1}, TypeError, "shuffle must be True or False"),
        ({"batch_size": 4, "num_workers": -1}, ValueError, "num_workers must be >= 0"),
        ({"batch_size": 4, "collate": "InputProcessor"}, TypeError, "collate must be"),
        ({"batch_size": 4, "device_mesh": "dp2"}, TypeError, "device_mesh must be a DeviceMesh"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        DataLoader(rows(8), **kwargs)


def test_min_batch_size_below_the_data_world_is_rejected(monkeypatch):
    as_rank(monkeypatch, 0, 2)
    mesh = DeviceMesh.from_sizes(dp_size=2, device_type="cpu")
    with pytest.raises(ValueError, match="empty share"):
        DataLoader(rows(8), batch_size=4, min_batch_size=1, device_mesh=mesh)


def test_a_mesh_larger_than_the_launch_is_rejected():
    mesh = DeviceMesh.from_sizes(dp_size=2, device_type="cpu")
    with pytest.raises(ValueError, match="torchrun --nproc_per_node=2"):
        DataLoader(rows(8), batch_size=4, device_mesh=mesh)


@pytest.mark.parametrize(
    ("dataset", "error", "match"),
    [
        ((f for f in ROWS), TypeError, "iterator"),
        ({"input_ids": [1]}, TypeError, "of type dict, not a dataset"),
        ("rows.jsonl", TypeError, "of type str, not a dataset"),
        (42, TypeError, "of type int, not a dataset"),
        (lambda: 42, TypeError, r"factory .*<lambda>\(\) returned is of type int"),
        ([], ValueError, "0 samples, fewer than min_batch_size=1"),
    ],
)
def test_things_that_are_not_datasets_are_rejected(dataset, error, match):
    with pytest.raises(error, match=match):
        DataLoader(dataset, batch_size=4)


def test_dataset_smaller_than_min_batch_size_is_rejected():
    with pytest.raises(ValueError, match="3 samples, fewer than min_batch_size=4"):
        DataLoader(rows(3), batch_size=4, drop_last=True)


def test_streams_refuse_shuffle_and_workers():
    with pytest.raises(ValueError, match="shuffle=True needs a map-style dataset"):
        DataLoader(Stream(8), batch_size=4, shuffle=True)
    with pytest.raises(ValueError, match="num_workers > 0 needs a map-style dataset"):
        DataLoader(Stream(8), batch_size=4, num_workers=2)


def test_a_stream_too_short_for_one_batch_is_rejected_when_read():
    loader = DataLoader(Stream(3), batch_size=4, drop_last=True)
    with pytest.raises(ValueError, match="yielded 3 samples, fewer than min_batch_size=4"):
        next(iter(loader))
