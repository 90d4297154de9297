"""Tinker's training routes: create_model, get_info, forward_backward/forward, optim_step,
save_weights, save_weights_for_sampler and load_weights.

A Tinker model is a Twinkle training run (``model_id`` = ``<session>:train:<n>``, the id the
SDK derives itself), so it shows in both clients' listings and its checkpoints are the same
records. Work goes to the model's worker in the run's lane, in seq_id order (``submit``); a
forward_backward may share one pass with other runs' (``model_ops.run_many``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from peft import LoraConfig

from twinkle.server import checkpoint_access
from twinkle.server.errors import BadRequest, Conflict, NotFound
from twinkle.server.names import CheckpointUri, check_name, parse_uri
from twinkle.server.routes.common import caller, field, json_body, ready, state_of
from twinkle.server.tinker import model_ops
from twinkle.server.tinker.base_model import check_base_model, served_repo_id
from twinkle.server.tinker.batch import build_batch
from twinkle.server.tinker.submit import (
    check_seq_id,
    checked,
    seq_of,
    submit_ordered,
    submit_unordered,
)

router = APIRouter()
TINKER_SCHEME = "tinker://"


def tinker_path(uri: CheckpointUri) -> str:
    return f"{TINKER_SCHEME}{uri.run_id}/{uri.kind}/{uri.name}"


def _check_base_model(state: Any, base_model: str | None) -> None:
    check_base_model(state.model.base_model, base_model, "trains")


def _check_optimizer(raw: Any) -> None:
    kind = raw.get("type", "adamw") if isinstance(raw, dict) else raw
    if raw is not None and kind != "adamw":
        raise BadRequest(f"optimizer {kind!r} is not supported; this server trains with adamw")


def _new_run(
    state: Any,
    principal: Any,
    session_id: str,
    run_id: str,
    lora: LoraConfig,
    seed: int | None,
    metadata: dict[str, Any],
) -> Any:
    """Runs on the worker: take a LoRA slot (seeded like Tinker's ``lora_config.seed``)."""
    run = state.model.create_run(
        principal, session_id, run_id, "tinker", lora, 1, metadata, seed=seed
    )
    live = state.model.live[run.id]
    model_ops.prepare_run(state.model, live.adapter)
    return live


def _model_id_for(state: Any, principal: Any, body: dict[str, Any]) -> tuple[Any, str]:
    session = state.sessions.get_open(principal, field(body, "session_id", str))
    model_seq = field(body, "model_seq_id", int)
    if model_seq < 0:
        raise BadRequest("model_seq_id must be >= 0")
    return session, f"{session.id}:train:{model_seq}"


def _new_model(state: Any, principal: Any, body: dict) -> tuple[Any, str, dict | None]:
    """The session and model id a create (or create-via-load) names; the first request's
    answer when this is a resubmit; 409 when the id is taken."""
    session, run_id = _model_id_for(state, principal, body)
    existing = state.tinker.ordering.known(run_id, 0)
    if existing is not None:
        return session, run_id, {"request_id": existing, "model_id": run_id}
    if state.store.get_run(principal.key_id, run_id) is not None:
        raise Conflict(f"model {run_id} already exists; use the next model_seq_id")
    return session, run_id, None


@router.post("/create_model")
async def create_model(request: Request) -> dict:
    principal = caller(request)
    state = ready(state_of(request))
    body = await json_body(request)
    session, run_id, resubmitted = _new_model(state, principal, body)
    if resubmitted is not None:
        return resubmitted
    _check_base_model(state, field(body, "base_model", str, None))
    _check_optimizer(body.get("optimizer_config"))
    lora, seed = model_ops.tinker_lora_config(body.get("lora_config"), state.config.model.max_rank)
    metadata = field(body, "user_metadata", dict, {})

    def create() -> dict:
        _new_run(state, principal, session.id, run_id, lora, seed, metadata)
        return {"model_id": run_id, "type": "create_model"}

    answer = submit_unordered(request, principal, run_id, "create_model", create)
    state.tinker.ordering.open(run_id, answer["request_id"])
    return {**answer, "model_id": run_id}


@router.post("/get_info")
async def get_info(request: Request) -> dict:
    principal = caller(request)
    state = ready(state_of(request))
    body = await json_body(request)
    model_id = field(body, "model_id", str)
    run = state.store.get_run(principal.key_id, model_id)
    if run is None:
        raise NotFound(f"no model {model_id!r}")
    return {
        "type": "get_info",
        "model_id": run.id,
        "model_data": {
            "model_name": run.base_model,
            "tokenizer_id": tokenizer_id(run.base_model, state.model.model_folder),
            "arch": "lora",
        },
        "model_name": run.base_model,
        "is_lora": True,
        "lora_rank": run.lora_rank,
        "optimizer_config": {"type": "adamw"},
    }


async def _fwdbwd(request: Request, forward_route: bool) -> dict:
    from twinkle.server.tinker.codec import (
        RejectedRequest,
        decode_forward_backward,
        encode_forward_backward_output,
    )
    from twinkle.server.tinker.losses import build_tinker_loss

    principal = caller(request)
    state = ready(state_of(request))
    raw = await request.body()
    try:
        fwd = decode_forward_backward(
            raw, request.headers.get("content-type", ""), state.config.limits
        )
    except RejectedRequest as exc:  # its seq_id was read: free it for the model's next ones
        if state.store.get_run(principal.key_id, exc.model_id) is not None:
            state.tinker.ordering.skip(exc.model_id, exc.seq_id)
        raise
    check_seq_id(fwd.seq_id)

    async def prepare() -> tuple:
        live = state.model.live_run(principal, fwd.model_id)
        loss = build_tinker_loss(fwd.loss_fn, fwd.loss_fn_config)
        built = build_batch(fwd.data, state.model.vocab_size, state.model.pad_token_id)
        loss.check_inputs(built[1])
        return live, loss, built

    live, loss, (batch, loss_inputs, lengths) = await checked(
        request, fwd.model_id, fwd.seq_id, prepare
    )
    forward_only = forward_route or fwd.forward_only

    def work() -> Any:
        outputs, metrics = model_ops.forward_backward(
            state.model, live.adapter, batch, loss_inputs, lengths, loss, forward_only
        )
        return encode_forward_backward_output(outputs, metrics)

    operation = "forward" if forward_only else "forward_backward"
    item = model_ops.TinkerPass(live, batch, loss_inputs, lengths, loss, forward_only)
    shared = model_ops.batchable(state.model, item, encode_forward_backward_output)
    return submit_ordered(request, principal, live, fwd.seq_id, operation, work, shared)


@router.post("/forward_backward")
async def forward_backward(request: Request) -> dict:
    return await _fwdbwd(request, forward_route=False)


@router.post("/forward")
async def forward(request: Request) -> dict:
    """SDK 0.16.1's forward (0.38 sends forward_backward with forward_only)."""
    return await _fwdbwd(request, forward_route=True)


async def _ordered_request(request: Request) -> tuple[Any, Any, dict[str, Any], int]:
    principal = caller(request)
    state = ready(state_of(request))
    body = await json_body(request)
    return principal, state, body, seq_of(body)


@router.post("/optim_step")
async def optim_step(request: Request) -> dict:
    principal, state, body, seq_id = await _ordered_request(request)

    async def prepare() -> tuple:
        live = state.model.live_run(principal, field(body, "model_id", str))
        optimizer = body.get("optimizer_params")
        if optimizer is not None:
            _check_optimizer(optimizer)
        return live, model_ops.adam_params(body.get("adam_params"))

    live, params = await checked(request, body.get("model_id"), seq_id, prepare)

    def work() -> dict:
        metrics = model_ops.optim_step(state.model, live.adapter, params)
        return {"type": "optim_step", "metrics": metrics}

    return submit_ordered(request, principal, live, seq_id, "optim_step", work)


@router.post("/save_weights")
async def save_weights(request: Request) -> dict:
    principal, state, body, seq_id = await _ordered_request(request)

    async def prepare() -> tuple:
        live = state.model.live_run(principal, field(body, "model_id", str))
        return live, check_name(field(body, "path", str)), ttl_of(state, body)

    live, name, ttl = await checked(request, body.get("model_id"), seq_id, prepare)
    overwrite = bool(body.get("overwrite", False))

    def work() -> dict:
        taken = state.store.get_checkpoint(principal.key_id, live.run.id, "weights", name)
        if checkpoint_access.live(taken) is not None and not overwrite:
            raise Conflict(f"checkpoint weights/{name} exists; pick another name or overwrite")
        uri = parse_uri(state.model._save(principal, live, name, True, None, overwrite))
        expire(state, principal, uri, ttl)
        return {"type": "save_weights", "path": tinker_path(uri)}

    return submit_ordered(request, principal, live, seq_id, "save_weights", work)


@router.post("/save_weights_for_sampler")
async def save_weights_for_sampler(request: Request) -> dict:
    """Named (``path``: a sampler checkpoint) or ephemeral (no path: weights registered as
    a sampling session, for ``save_weights_and_get_sampling_client``)."""
    principal, state, body, seq_id = await _ordered_request(request)

    async def prepare() -> tuple:
        live = state.model.live_run(principal, field(body, "model_id", str))
        name = body.get("path")
        if name is not None:
            return live, check_name(name), ttl_of(state, body)
        if state.sampler is None or not state.sampler.available:
            raise BadRequest(
                "this server has no sampler enabled: it cannot serve a sampling client"
            )
        return live, None, field(body, "sampling_session_seq_id", int)

    live, name, ttl_or_seq = await checked(request, body.get("model_id"), seq_id, prepare)

    def named() -> dict:
        path = state.model._save(principal, live, name, False, None, True, "sampler_weights")
        expire(state, principal, parse_uri(path), ttl_or_seq)
        return {"type": "save_weights_for_sampler", "path": tinker_path(parse_uri(path))}

    def ephemeral() -> dict:
        folder = model_ops.save_ephemeral(state.model, principal, live, ttl_or_seq)
        sampler_id = state.tinker.sampling.register(
            principal, live.run.session_id, ttl_or_seq, folder
        )
        return {"type": "save_weights_for_sampler", "sampling_session_id": sampler_id}

    work = named if name is not None else ephemeral
    return submit_ordered(request, principal, live, seq_id, "save_weights_for_sampler", work)


@router.post("/load_weights")
async def load_weights(request: Request) -> dict:
    """With ``model_id``: load a checkpoint into that model (in seq_id order). Without (SDK
    0.38's create_training_client_from_state): create ``<session>:train:<model_seq_id>``
    from the checkpoint's run settings, then load it."""
    principal = caller(request)
    state = ready(state_of(request))
    body = await json_body(request)
    path = field(body, "path", str)
    optimizer = bool(body.get("optimizer", False))
    if body.get("model_id") is None:
        return _create_from_checkpoint(request, principal, state, body, path, optimizer)
    seq_id = seq_of(body)

    async def prepare() -> Any:
        live = state.model.live_run(principal, field(body, "model_id", str))
        state.model.owned_checkpoint(principal, path)
        return live

    live = await checked(request, body.get("model_id"), seq_id, prepare)

    def work() -> dict:
        state.model._load(principal, live, path, load_optimizer=optimizer)
        return {"type": "load_weights", "path": path, "model_id": live.run.id}

    return submit_ordered(request, principal, live, seq_id, "load_weights", work)


def _create_from_checkpoint(
    request: Request, principal: Any, state: Any, body: dict, path: str, optimizer: bool
) -> dict:
    session, run_id, resubmitted = _new_model(state, principal, body)
    if resubmitted is not None:
        return resubmitted
    record = state.model.owned_checkpoint(principal, path)  # the caller's, or published
    source = state.store.get_run(record.owner, record.run_id)
    if source is None:
        raise NotFound(f"no training run {record.run_id!r} for checkpoint {path}")
    _check_base_model(state, field(body, "base_model", str, None))
    _check_optimizer(body.get("optimizer_config"))
    lora = LoraConfig(**source.lora_config)
    metadata = field(body, "user_metadata", dict, source.user_metadata)

    def create_and_load() -> dict:
        live = _new_run(state, principal, session.id, run_id, lora, None, metadata)
        state.model._load(principal, live, path, load_optimizer=optimizer)
        return {"type": "load_weights", "path": path, "model_id": run_id}

    answer = submit_unordered(request, principal, run_id, "load_weights", create_and_load)
    state.tinker.ordering.open(run_id, answer["request_id"])
    return {**answer, "model_id": run_id}


def ttl_of(state: Any, body: dict[str, Any]) -> int | None:
    """A save's ``ttl_seconds``, checked before the save is queued (None: kept for good)."""
    ttl = body.get("ttl_seconds")
    if ttl is not None:
        checkpoint_access.expiry(ttl, state.config.limits.max_checkpoint_ttl_s)
    return ttl


def expire(state: Any, principal: Any, uri: CheckpointUri, ttl: int | None) -> None:
    """Give a just-saved checkpoint its TTL (from when it was saved); none clears an old one."""
    expires_at = None
    if ttl is not None:
        expires_at = checkpoint_access.expiry(ttl, state.config.limits.max_checkpoint_ttl_s)
    state.store.set_checkpoint_expiry(principal.key_id, uri.run_id, uri.kind, uri.name, expires_at)


def tokenizer_id(base_model: str, folder: str | None) -> str:
    """What the SDK passes to ``AutoTokenizer.from_pretrained`` on the client's machine: the
    repo id of a hub model (``ms://Qwen/Qwen3-4B`` -> ``Qwen/Qwen3-4B``, also on Hugging
    Face), else the server's local folder (bundled or local models: same-machine clients)."""
    repo_id = served_repo_id(base_model)
    if repo_id is not None:
        return repo_id
    return folder if folder is not None else base_model
