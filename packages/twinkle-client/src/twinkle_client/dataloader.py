"""DataLoader, remotely: batches of a server-side Dataset, as InputFeatures.

Iterating fetches one batch per request; ``get_state``/``resume_from_checkpoint`` work as
the local DataLoader's, so a resumed client run skips the data it already trained on.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from twinkle.data_format import InputFeature
from twinkle_client._wire import clean
from twinkle_client.dataset import Dataset
from twinkle_client.manager import get_client


class DataLoader:
    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int | None = None,
        drop_last: bool = False,
        min_batch_size: int | None = None,
    ) -> None:
        if not isinstance(dataset, Dataset):
            raise TypeError("a remote DataLoader takes a twinkle_client.dataset.Dataset")
        self.client = get_client(dataset.client)
        args = clean(
            {
                "batch_size": batch_size,
                "shuffle": shuffle,
                "seed": seed,
                "drop_last": drop_last,
                "min_batch_size": min_batch_size,
            }
        )
        body = {"dataset_id": dataset.dataset_id, "args": args}
        self.dataloader_id: str = self.client.call("/dataloader/create", body)

    def _call(self, method: str, **args: Any) -> Any:
        body = {"dataloader_id": self.dataloader_id, "args": clean(args)}
        return self.client.call(f"/dataloader/{method}", body)

    def __iter__(self) -> Iterator[list[InputFeature]]:
        self._call("iter")
        while True:
            answer = self._call("next")
            if answer["done"]:
                return
            yield [_row(row) for row in answer["batch"]]

    def __len__(self) -> int:
        return int(self._call("len"))

    def get_state(self) -> dict[str, int]:
        return self._call("get_state")

    def resume_from_checkpoint(self, consumed_train_samples: int) -> None:
        self._call("resume_from_checkpoint", consumed_train_samples=consumed_train_samples)


def _row(row: dict[str, Any]) -> Any:
    return InputFeature.from_dict(row) if "input_ids" in row else row
