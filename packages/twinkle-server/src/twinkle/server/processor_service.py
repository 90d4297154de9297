"""The processor service: datasets and dataloaders built server-side for clients that ask.

A client names a dataset from the allow-list, and a template, preprocessor and encoding by
name; rows are encoded here with the served model's tokenizer and handed out in batches of
InputFeatures, which the client then sends to the model. Each dataset and dataloader is
owned by one key and lives in memory (it is rebuilt from its recipe, not persisted).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from twinkle.server.auth import Principal
from twinkle.server.config import ServerConfig
from twinkle.server.errors import BadRequest, NotFound, RateLimited
from twinkle.server.scheduler import FairWorker
from twinkle.server.wire import (
    bounded_workers,
    check_allowed,
    encode,
    plain_kwargs,
    template_kwargs,
)


@dataclass
class Owned:
    owner: str
    obj: Any


class ProcessorService:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.worker = FairWorker("processor")
        self.datasets: dict[str, Owned] = {}
        self.loaders: dict[str, Owned] = {}

    def _get(self, table: dict[str, Owned], principal: Principal, key: Any, what: str) -> Any:
        item = table.get(key) if isinstance(key, str) else None
        if item is None or item.owner != principal.key_id:
            raise NotFound(f"no {what} {key!r}")
        return item.obj

    def create_dataset(self, principal: Principal, meta: Any) -> str:
        from twinkle.dataset import Dataset, DatasetMeta

        if not isinstance(meta, dict):
            raise BadRequest("dataset_meta must be an object with dataset_id")
        check_allowed(meta.get("dataset_id"), self.config.allow.datasets, "dataset")
        owned = sum(1 for d in self.datasets.values() if d.owner == principal.key_id)
        if owned >= self.config.limits.max_datasets_per_key:
            raise RateLimited(f"a key may hold {self.config.limits.max_datasets_per_key} datasets")
        data_slice = meta.get("data_slice")
        if data_slice is not None:
            if not (
                isinstance(data_slice, list)
                and len(data_slice) == 2
                and all(isinstance(v, int) and v >= 0 for v in data_slice)
            ):
                raise BadRequest("data_slice must be [start, stop]")
            data_slice = range(*data_slice)
        dataset = Dataset(
            DatasetMeta(
                meta["dataset_id"],
                subset_name=meta.get("subset_name"),
                split=meta.get("split") or "train",
                data_slice=data_slice,
            )
        )
        dataset_id = "ds-" + secrets.token_hex(8)
        self.datasets[dataset_id] = Owned(principal.key_id, dataset)
        return dataset_id

    def dataset_call(self, principal: Principal, dataset_id: Any, method: str, args: dict) -> Any:
        dataset = self._get(self.datasets, principal, dataset_id, "dataset")
        allow = self.config.allow
        if method == "set_template":
            name = check_allowed(args.pop("template", None), allow.templates, "template")
            dataset.set_template(name, **template_kwargs(args, name, self.config.model.model_id))
        elif method == "map":
            name = check_allowed(
                args.pop("preprocessor", None), allow.preprocessors, "preprocessor"
            )
            init_args = plain_kwargs(args.pop("init_args", None), name)
            dataset.map(name, init_args=init_args, **bounded_workers(plain_kwargs(args, "map")))
        elif method == "encode":
            dataset.encode(**bounded_workers(plain_kwargs(args, "encode")))
        elif method == "len":
            return len(dataset)
        else:
            raise BadRequest(f"unknown dataset method {method!r}")
        return len(dataset)

    def create_loader(self, principal: Principal, dataset_id: Any, args: dict) -> str:
        from twinkle.dataloader import DataLoader

        dataset = self._get(self.datasets, principal, dataset_id, "dataset")
        kwargs = plain_kwargs(args, "DataLoader")
        unknown = set(kwargs) - {"batch_size", "shuffle", "seed", "drop_last", "min_batch_size"}
        if unknown:
            raise BadRequest(f"DataLoader takes no argument(s) {sorted(unknown)} remotely")
        loader = DataLoader(dataset=dataset, **kwargs)
        loader_id = "dl-" + secrets.token_hex(8)
        self.loaders[loader_id] = Owned(principal.key_id, loader)
        return loader_id

    def loader_call(self, principal: Principal, loader_id: Any, method: str, args: dict) -> Any:
        loader = self._get(self.loaders, principal, loader_id, "dataloader")
        if method == "next":
            try:
                return {"batch": encode(list(next(loader))), "done": False}
            except StopIteration:
                return {"batch": None, "done": True}
        if method == "iter":
            iter(loader)
            return {"length": len(loader)}
        if method == "len":
            return len(loader)
        if method == "get_state":
            return loader.get_state()
        if method == "resume_from_checkpoint":
            loader.resume_from_checkpoint(args.get("consumed_train_samples"))
            return None
        raise BadRequest(f"unknown dataloader method {method!r}")

    def stop(self) -> None:
        self.worker.stop()
