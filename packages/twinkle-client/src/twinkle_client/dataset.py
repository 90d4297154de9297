"""Dataset, remotely: the server loads, preprocesses and encodes rows with its tokenizer.

The dataset is named by a DatasetMeta (``twinkle.dataset.DatasetMeta`` or this module's
torch-free one); the server accepts only the datasets on its allow-list and never a local
path. Templates and preprocessors are named; their arguments are plain values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from twinkle_client._wire import clean, name_of
from twinkle_client.manager import TwinkleClient, get_client


@dataclass
class DatasetMeta:
    """The torch-free twin of ``twinkle.dataset.DatasetMeta`` (the fields that travel)."""

    dataset_id: str
    subset_name: str | None = None
    split: str = "train"
    data_slice: range | None = None


def meta_dict(meta: Any) -> dict[str, Any]:
    data_slice = getattr(meta, "data_slice", None)
    if data_slice is not None:
        if isinstance(data_slice, slice):
            data_slice = range(data_slice.start or 0, data_slice.stop)
        if not isinstance(data_slice, range) or data_slice.step != 1:
            raise ValueError("a remote data_slice must be a range(start, stop) with step 1")
        data_slice = [data_slice.start, data_slice.stop]
    if getattr(meta, "data", None) is not None:
        raise ValueError("in-memory data cannot be sent: name a dataset the server allows")
    return clean(
        {
            "dataset_id": meta.dataset_id,
            "subset_name": getattr(meta, "subset_name", None),
            "split": getattr(meta, "split", None),
            "data_slice": data_slice,
        }
    )


class Dataset:
    def __init__(self, dataset_meta: Any, *, client: TwinkleClient | None = None) -> None:
        self.client = get_client(client)
        body = {"dataset_meta": meta_dict(dataset_meta)}
        self.dataset_id: str = self.client.call("/dataset/create", body)
        self._length: int | None = None

    def _call(self, method: str, **args: Any) -> Any:
        body = {"dataset_id": self.dataset_id, "args": clean(args)}
        self._length = self.client.call(f"/dataset/{method}", body)
        return self._length

    def set_template(self, template: Any, **kwargs: Any) -> None:
        kwargs.pop("model_id", None)
        self._call("set_template", template=name_of(template, "template"), **kwargs)

    def map(
        self,
        preprocessor: Any,
        init_args: dict[str, Any] | None = None,
        batched: bool = True,
        num_proc: int | None = None,
        load_from_cache_file: bool | None = None,
        on_error: str = "raise",
    ) -> None:
        self._call(
            "map",
            preprocessor=name_of(preprocessor, "preprocessor"),
            init_args=init_args,
            batched=batched,
            num_proc=num_proc,
            load_from_cache_file=load_from_cache_file,
            on_error=on_error,
        )

    def encode(
        self,
        batched: bool = True,
        add_generation_prompt: bool = False,
        num_proc: int | None = None,
        load_from_cache_file: bool | None = None,
        on_error: str = "raise",
    ) -> None:
        self._call(
            "encode",
            batched=batched,
            add_generation_prompt=add_generation_prompt,
            num_proc=num_proc,
            load_from_cache_file=load_from_cache_file,
            on_error=on_error,
        )

    def __len__(self) -> int:
        return int(self._call("len"))
