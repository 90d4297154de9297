"""DataLoader and InputProcessor over real twinkle datasets: an encoded Dataset, a
PackingDataset (padding-free collation must agree with its packing) and a stream."""

from __future__ import annotations

import pytest
import torch

from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta, IterableDataset, PackingDataset
from twinkle.infra import reset
from twinkle.mesh import DeviceMesh
from twinkle.processor import IGNORE_INDEX, InputProcessor

ROWS = [
    {
        "messages": [
            {"role": "user", "content": f"question {i}"},
            {"role": "assistant", "content": "answer " * (i % 7 + 1)},
        ]
    }
    for i in range(30)
]


def prepare(dataset):
    dataset.map("MessagesProcessor")
    dataset.set_template("Template", model_id="bundled://tiny-qwen3", max_length=64)
    dataset.encode()
    return dataset


@pytest.fixture(scope="module")
def encoded() -> Dataset:
    return prepare(Dataset(DatasetMeta(data=ROWS)))


@pytest.fixture(scope="module")
def packed() -> PackingDataset:
    dataset = prepare(PackingDataset(DatasetMeta(data=ROWS), max_length=64))
    dataset.pack_dataset()
    return dataset


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    reset()
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


def tokens(batch) -> list[tuple[int, ...]]:
    return [tuple(int(t) for t in feature["input_ids"]) for feature in batch]


def take(loader: DataLoader, steps: int) -> list[list[tuple[int, ...]]]:
    out = []
    while len(out) < steps:
        for batch in loader:
            out.append(tokens(batch))
            if len(out) == steps:
                break
    return out


def test_a_dataset_resumes_exactly_mid_epoch_and_across_epochs(encoded):
    def loader() -> DataLoader:
        return DataLoader(dataset=encoded, batch_size=8, shuffle=True)

    assert len(loader()) == 4
    uninterrupted = take(loader(), 10)
    assert sorted(t for batch in uninterrupted[:4] for t in batch) == sorted(
        tokens(encoded[i] for i in range(len(encoded)))
    )
    for steps_before in (2, 4, 6):
        first = loader()
        before = take(first, steps_before)
        resumed = loader()
        resumed.resume_from_checkpoint(first.get_state()["consumed_train_samples"])
        assert before + take(resumed, 10 - steps_before) == uninterrupted


def test_two_data_ranks_share_each_batch_of_a_dataset(monkeypatch, encoded):
    mesh = DeviceMesh.from_sizes(dp_size=2, device_type="cpu")
    whole = take(DataLoader(encoded, batch_size=8, shuffle=True), 4)
    shares = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        shares.append(take(DataLoader(encoded, batch_size=8, shuffle=True, device_mesh=mesh), 4))
    assert [a + b for a, b in zip(*shares, strict=True)] == whole


def test_padding_free_collation_agrees_with_packing(packed):
    processor = InputProcessor(padding_free=True, pad_to_multiple_of=8)
    for batch in DataLoader(packed, batch_size=2):
        inputs = processor(batch)
        seq_lens = [n for feature in batch for n in feature["seq_lens"]]
        padding = [inputs["num_pad_tokens"]] if inputs["num_pad_tokens"] else []
        assert inputs["cu_seq_lens_q"].diff().tolist() == seq_lens + padding
        # PackingDataset's labels already hold -100 at every sequence start; collating
        # changes nothing else.
        packed_labels = torch.cat([torch.as_tensor(feature["labels"]) for feature in batch])
        total = packed_labels.numel()
        assert torch.equal(inputs["labels"][0, :total], packed_labels)
        assert (inputs["labels"][0, inputs["cu_seq_lens_q"][:-1].long()] == IGNORE_INDEX).all()
        pieces = processor.unpack(inputs["input_ids"], inputs)
        row = torch.cat([torch.as_tensor(feature["input_ids"]) for feature in batch])
        assert [p.tolist() for p in pieces] == [s.tolist() for s in row.split(seq_lens)]


def test_a_packed_dataset_cannot_be_collated_with_padding(packed):
    with pytest.raises(ValueError, match="padding_free=True"):
        InputProcessor(padding_free=False)(next(iter(DataLoader(packed, batch_size=2))))


def test_by_default_a_packed_dataset_is_collated_padding_free(packed):
    batch = InputProcessor()(next(iter(DataLoader(packed, batch_size=2))))
    assert batch["input_ids"].shape[0] == 1 and "attention_mask" not in batch


def test_a_streaming_dataset_resumes_exactly():
    stream = prepare(IterableDataset(DatasetMeta(data=ROWS)))

    def loader() -> DataLoader:
        return DataLoader(stream, batch_size=8, min_batch_size=4)

    uninterrupted = take(loader(), 9)
    assert [len(batch) for batch in uninterrupted[:4]] == [8, 8, 8, 6]
    first = loader()
    before = take(first, 5)
    resumed = loader()
    resumed.resume_from_checkpoint(first.get_state()["consumed_train_samples"])
    assert before + take(resumed, 4) == uninterrupted
