"""Server-side datasets and dataloaders (the processor service), for the client's proxies."""

from __future__ import annotations

from fastapi import APIRouter, Request

from twinkle.server.errors import Unavailable
from twinkle.server.routes.common import caller, field, json_body, ready, state_of
from twinkle.server.routes.models import _run_work

router = APIRouter()


def _service(request: Request):
    state = ready(state_of(request))
    if state.processor is None:
        raise Unavailable("this server builds no datasets (processor_enabled is false)")
    return state.processor


@router.post("/twinkle/dataset/create")
async def create_dataset(request: Request) -> dict:
    principal = caller(request)
    service = _service(request)
    meta = field(await json_body(request), "dataset_meta", dict)
    return await _run_work(
        request,
        principal,
        "dataset.create",
        service.worker,
        principal.key_id,
        lambda: service.create_dataset(principal, meta),
    )


@router.post("/twinkle/dataset/{method}")
async def dataset_method(method: str, request: Request) -> dict:
    principal = caller(request)
    service = _service(request)
    body = await json_body(request)
    dataset_id = field(body, "dataset_id", str)
    args = dict(field(body, "args", dict, {}))
    return await _run_work(
        request,
        principal,
        f"dataset.{method}",
        service.worker,
        principal.key_id,
        lambda: service.dataset_call(principal, dataset_id, method, args),
    )


@router.post("/twinkle/dataloader/create")
async def create_loader(request: Request) -> dict:
    principal = caller(request)
    service = _service(request)
    body = await json_body(request)
    dataset_id = field(body, "dataset_id", str)
    args = field(body, "args", dict, {})
    return await _run_work(
        request,
        principal,
        "dataloader.create",
        service.worker,
        principal.key_id,
        lambda: service.create_loader(principal, dataset_id, args),
    )


@router.post("/twinkle/dataloader/{method}")
async def loader_method(method: str, request: Request) -> dict:
    principal = caller(request)
    service = _service(request)
    body = await json_body(request)
    loader_id = field(body, "dataloader_id", str)
    args = field(body, "args", dict, {})
    return await _run_work(
        request,
        principal,
        f"dataloader.{method}",
        service.worker,
        principal.key_id,
        lambda: service.loader_call(principal, loader_id, method, args),
    )
