"""forward_backward on the Tinker wire: the request in, the ``ForwardBackwardOutput`` out.

SDK 0.38 posts a protobuf ``ForwardBackwardRequest`` to ``/forward_backward`` (``forward()``
sets ``forward_only``); SDK 0.16.1 posts JSON to ``/forward_backward``
(``{forward_backward_input: {data, loss_fn, loss_fn_config?}, model_id, seq_id}``) and to
``/forward`` (``{forward_input: {...}, ...}``), leaving unset fields out. Both decode to one
``FwdBwdRequest`` holding dense numpy inputs. The result goes back in both encodings
(``ProtoResult``): retrieve_future picks one from the client's Accept header.

Only text chunks are accepted (images and audio are user errors), and provenance spans are
ignored: they matter only to ``stable_reinforce``, which this server rejects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from google.protobuf.message import DecodeError

from twinkle.server.errors import ApiError, BadRequest
from twinkle.server.limits import check_rows, check_tokens
from twinkle.server.tinker import proto_schema as schema
from twinkle.server.tinker.results import PROTO_MEDIA_TYPE, ProtoResult
from twinkle.server.tinker.tensors import (
    json_dtype,
    tensor_from_json,
    tensor_from_proto,
    tensor_to_json,
)
from twinkle.server.wire import parse_json

if TYPE_CHECKING:
    from twinkle.server.config import Limits

OUTPUT_TYPE = "ArrayRecord"


@dataclass(frozen=True)
class TinkerDatum:
    """One example: the model input ``tokens`` and its per-token loss inputs
    (``target_tokens``, ``weights``, ``logprobs``, ``advantages``...) as dense arrays."""

    tokens: list[int]
    inputs: dict[str, np.ndarray] = field(default_factory=dict)


class RejectedRequest(BadRequest):
    """A request whose ``model_id`` and ``seq_id`` were read but whose contents were not: the
    route frees that seq_id, so the model's later requests do not wait for it."""

    def __init__(self, message: str, model_id: str, seq_id: int) -> None:
        super().__init__(message)
        self.model_id, self.seq_id = model_id, seq_id


def _rejected(exc: ApiError, model_id: Any, seq_id: Any) -> ApiError:
    """``exc`` as a RejectedRequest (same status and code) once its model and seq_id are known."""
    if isinstance(model_id, str) and model_id and isinstance(seq_id, int):
        rejected = RejectedRequest(exc.message, model_id, seq_id)
        rejected.status, rejected.code = exc.status, exc.code
        return rejected
    return exc


@dataclass(frozen=True)
class FwdBwdRequest:
    model_id: str
    seq_id: int | None
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool
    data: list[TinkerDatum]


def decode_forward_backward(body: bytes, content_type: str | None, limits: Limits) -> FwdBwdRequest:
    """The request of ``/forward_backward`` (protobuf or JSON) or of ``/forward`` (JSON),
    within the server's ``limits`` (rows, tokens per datum, values per tensor, nesting),
    checked before anything of that size is built."""
    if (content_type or "").split(";")[0].strip().lower() == PROTO_MEDIA_TYPE:
        return _from_proto(body, limits)
    what = f"the forward_backward body (neither protobuf, {PROTO_MEDIA_TYPE}, nor JSON)"
    obj = parse_json(body or b"{}", limits, what)
    if not isinstance(obj, dict):
        raise BadRequest("the forward_backward body must be a JSON object")
    return _from_json(obj, limits)


# ---- protobuf (SDK 0.38) ------------------------------------------------------------------


def _from_proto(body: bytes, limits: Limits) -> FwdBwdRequest:
    msg = schema.message("ForwardBackwardRequest")()
    try:
        msg.ParseFromString(body)
    except DecodeError:
        raise BadRequest(
            "the forward_backward body is not a valid protobuf ForwardBackwardRequest "
            "(compressed bodies are not accepted: this server's client/config turns "
            "proto_compress_fwdbwd off)"
        ) from None
    try:
        if msg.loss_fn_config_v2:
            config = {k: _config_value(v, k) for k, v in msg.loss_fn_config_v2.items()}
        else:
            config = {k: float(v) for k, v in msg.loss_fn_config.items()}
        check_rows(len(msg.data), limits, "the request's data")
        data = [_proto_datum(datum, i, limits) for i, datum in enumerate(msg.data)]
        return _request(msg.model_id, msg.seq_id, msg.loss_fn, config, msg.forward_only, data)
    except ApiError as exc:
        raise _rejected(exc, msg.model_id, msg.seq_id) from None


def _config_value(value: Any, key: str) -> float | str:
    kind = value.WhichOneof("value")
    if kind is None:
        raise BadRequest(f"loss_fn_config[{key!r}] has no value")
    return float(value.number) if kind == "number" else str(value.text)


def _proto_datum(msg: Any, index: int, limits: Limits) -> TinkerDatum:
    tokens: list[int] = []
    for position, chunk in enumerate(msg.model_input):
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise _non_text(f"data[{index}]", position, kind)
        raw = chunk.encoded_text.tokens
        if len(raw) % 4:
            raise BadRequest(f"data[{index}] chunk {position}: tokens are not int32 values")
        check_tokens(len(tokens) + len(raw) // 4, limits, f"data[{index}]")
        tokens.extend(np.frombuffer(raw, dtype="<i4").tolist())
    inputs = {
        name: tensor_from_proto(tensor, f"data[{index}].loss_fn_inputs[{name!r}]", limits)
        for name, tensor in msg.loss_fn_inputs.items()
    }
    return TinkerDatum(tokens, inputs)


def _non_text(where: str, position: int, kind: str | None) -> BadRequest:
    return BadRequest(
        f"{where} chunk {position} is {kind or 'empty'}: this server takes text only; send "
        "encoded_text chunks"
    )


def tokens_from_json(model_input: Any, where: str, limits: Limits) -> list[int]:
    """The token ids of a JSON ``ModelInput`` (``{chunks: [...]}``); text chunks only, at
    most ``limits.max_sequence_tokens``."""
    chunks = model_input.get("chunks") if isinstance(model_input, dict) else None
    if not isinstance(chunks, list):
        raise BadRequest(f"{where}: the model input must be {{chunks: [...]}}")
    tokens: list[int] = []
    for position, chunk in enumerate(chunks):
        # SDK 0.16.1 leaves the default type out: a chunk with tokens and no type is text.
        kind = chunk.get("type", "encoded_text") if isinstance(chunk, dict) else None
        if kind != "encoded_text":
            raise _non_text(where, position, kind)
        values = chunk.get("tokens")
        if not isinstance(values, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in values
        ):
            raise BadRequest(f"{where} chunk {position}: tokens must be a list of ints")
        check_tokens(len(tokens) + len(values), limits, where)
        tokens.extend(values)
    return tokens


# ---- JSON (SDK 0.16.1) --------------------------------------------------------------------


def _from_json(obj: dict[str, Any], limits: Limits) -> FwdBwdRequest:
    seq_id = obj.get("seq_id")
    if seq_id is not None and (isinstance(seq_id, bool) or not isinstance(seq_id, int)):
        raise BadRequest(f"seq_id must be an integer, got {seq_id!r}")
    try:
        return _from_json_input(obj, seq_id, limits)
    except ApiError as exc:
        raise _rejected(exc, obj.get("model_id"), seq_id) from None


def _from_json_input(obj: dict[str, Any], seq_id: int | None, limits: Limits) -> FwdBwdRequest:
    forward_only = "forward_input" in obj
    payload = obj.get("forward_input") if forward_only else obj.get("forward_backward_input")
    if payload is None and "data" in obj:  # the input object alone
        payload = obj
    if not isinstance(payload, dict):
        raise BadRequest(
            "the body needs forward_backward_input (or forward_input for /forward): "
            "{data, loss_fn, loss_fn_config}"
        )
    config = payload.get("loss_fn_config") or {}
    if not isinstance(config, dict) or not all(
        isinstance(v, int | float | str) and not isinstance(v, bool) for v in config.values()
    ):
        raise BadRequest("loss_fn_config must map names to numbers or strings")
    config = {k: v if isinstance(v, str) else float(v) for k, v in config.items()}
    data = payload.get("data")
    if not isinstance(data, list):
        raise BadRequest("forward_backward_input.data must be a list of Datum objects")
    check_rows(len(data), limits, "forward_backward_input.data")
    forward_only = forward_only or bool(obj.get("forward_only", False))
    return _request(
        obj.get("model_id"),
        seq_id,
        payload.get("loss_fn"),
        config,
        forward_only,
        [_json_datum(d, i, limits) for i, d in enumerate(data)],
    )


def _json_datum(obj: Any, index: int, limits: Limits) -> TinkerDatum:
    if not isinstance(obj, dict):
        raise BadRequest(f"data[{index}] must be a Datum object {{model_input, loss_fn_inputs}}")
    tokens = tokens_from_json(obj.get("model_input"), f"data[{index}]", limits)
    raw_inputs = obj.get("loss_fn_inputs") or {}
    if not isinstance(raw_inputs, dict):
        raise BadRequest(f"data[{index}].loss_fn_inputs must map names to TensorData")
    inputs = {
        name: tensor_from_json(value, f"data[{index}].loss_fn_inputs[{name!r}]", limits)
        for name, value in raw_inputs.items()
    }
    return TinkerDatum(tokens, inputs)


def _request(
    model_id: Any,
    seq_id: int | None,
    loss_fn: Any,
    config: dict[str, float | str],
    forward_only: bool,
    data: list[TinkerDatum],
) -> FwdBwdRequest:
    if not isinstance(model_id, str) or not model_id:
        raise BadRequest("the request needs model_id (the training client's model)")
    if not isinstance(loss_fn, str) or not loss_fn:
        raise BadRequest("the request needs loss_fn, e.g. 'cross_entropy'")
    if not data:
        raise BadRequest("the request has no data: send at least one Datum")
    return FwdBwdRequest(model_id, seq_id, loss_fn, config, forward_only, data)


# ---- the result ---------------------------------------------------------------------------


def check_metric_keys(metrics: dict[str, float]) -> None:
    """The SDK merges chunks' metrics by splitting each key on ':' into name and reduction;
    a key without exactly one colon crashes it."""
    bad = [key for key in metrics if key.count(":") != 1]
    if bad:
        raise ValueError(f"metric keys must read 'name:reduction' (one colon), got {bad}")


def encode_forward_backward_output(
    outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]
) -> ProtoResult:
    """One output dict per datum (in request order) and the ``name:reduction`` metrics, as a
    protobuf ``ForwardBackwardOutput`` (one batched ArrayRecord) and as 0.16.1's JSON."""
    check_metric_keys(metrics)
    names = list(outputs[0]) if outputs else []
    for index, output in enumerate(outputs):
        if list(output) != names:
            raise ValueError(f"output {index} has fields {list(output)}, output 0 has {names}")
    msg = schema.message("ForwardBackwardOutput")()
    msg.loss_fn_output_type = OUTPUT_TYPE
    for key, value in metrics.items():
        msg.metrics[key] = float(value)
    record = msg.loss_fn_outputs.add(type_tag=OUTPUT_TYPE, num_datums=len(outputs))
    for name in names:
        _batch_field(record.fields[name], [np.asarray(o[name]) for o in outputs], name)
    json_result = {
        "loss_fn_output_type": OUTPUT_TYPE,
        "loss_fn_outputs": [
            {k: tensor_to_json(np.asarray(v)) for k, v in o.items()} for o in outputs
        ],
        "metrics": {k: float(v) for k, v in metrics.items()},
    }
    return ProtoResult(json=json_result, proto=msg.SerializeToString())


def _batch_field(batched: Any, arrays: list[np.ndarray], name: str) -> None:
    """Concatenate one field of every datum; ``offsets`` are byte offsets, one per datum
    boundary, and each datum is read back as ``[n, *trailing_shape]``."""
    dtype = json_dtype(arrays[0])
    trailing = arrays[0].shape[1:]
    if any(json_dtype(a) != dtype or a.shape[1:] != trailing for a in arrays):
        raise ValueError(f"output field {name!r} differs in dtype or trailing shape across datums")
    np_dtype = np.dtype("<i8") if dtype == "int64" else np.dtype("<f4")
    pieces = [np.ascontiguousarray(a, dtype=np_dtype).tobytes() for a in arrays]
    offsets = np.cumsum([0] + [len(p) for p in pieces], dtype=np.int64)
    batched.data = b"".join(pieces)
    batched.offsets = offsets.astype("<i8").tobytes()
    batched.dtype = schema.DTYPE_INT64 if dtype == "int64" else schema.DTYPE_FLOAT32
    batched.trailing_shape.extend(int(s) for s in trailing)
