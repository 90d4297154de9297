"""The protobuf messages of the Tinker wire (SDK 0.38), built in code from their field table.

Only the messages the server reads or writes are declared: the forward_backward request,
its output, and the sample response, with the types they contain. Field names, numbers and
types follow the public schema (see the Tinker SPEC, section 4.4); the package name is our
own and never reaches the wire, so the classes live in a private descriptor pool and never
clash with the SDK's when both are imported in one process. No ``protoc`` step: the table
below is the schema.

``message(name)`` returns a message class, e.g. ``message("ForwardBackwardRequest")()``.
"""

from __future__ import annotations

from functools import cache

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

PACKAGE = "twinkle_tinker_wire"
_F = descriptor_pb2.FieldDescriptorProto

# Enum values of DType and StopReason, as numbered on the wire.
DTYPE_UNSPECIFIED, DTYPE_FLOAT32, DTYPE_INT64, DTYPE_INT32, DTYPE_BFLOAT16 = 0, 1, 2, 3, 4
STOP_REASON_STOP, STOP_REASON_LENGTH = 0, 1

_ENUMS = {
    "DType": [
        ("DTYPE_UNSPECIFIED", 0),
        ("DTYPE_FLOAT32", 1),
        ("DTYPE_INT64", 2),
        ("DTYPE_INT32", 3),
        ("DTYPE_BFLOAT16", 4),
    ],
    "StopReason": [("STOP_REASON_STOP", 0), ("STOP_REASON_LENGTH", 1)],
}

_SCALARS = {
    "string": _F.TYPE_STRING,
    "bytes": _F.TYPE_BYTES,
    "bool": _F.TYPE_BOOL,
    "double": _F.TYPE_DOUBLE,
    "int32": _F.TYPE_INT32,
    "int64": _F.TYPE_INT64,
    "uint32": _F.TYPE_UINT32,
}

# message -> [(field name, number, type, mode)]; mode is "" (singular), "repeated",
# "optional" (proto3 optional: presence tracked), "oneof:<name>", or "map:<key type>"
# (then the type is the value type).
_MESSAGES: dict[str, list[tuple[str, int, str, str]]] = {
    "ForwardBackwardRequest": [
        ("model_id", 1, "string", ""),
        ("seq_id", 2, "int32", ""),
        ("data", 3, "Datum", "repeated"),
        ("loss_fn", 4, "string", ""),
        ("loss_fn_config", 5, "double", "map:string"),
        ("forward_only", 6, "bool", ""),
        ("loss_fn_config_v2", 7, "LossConfigValue", "map:string"),
    ],
    "LossConfigValue": [
        ("number", 1, "double", "oneof:value"),
        ("text", 2, "string", "oneof:value"),
    ],
    "Datum": [
        ("model_input", 1, "Chunk", "repeated"),
        ("loss_fn_inputs", 2, "Tensor", "map:string"),
        ("model_input_spans", 3, "ProvenanceSpan", "repeated"),
        ("loss_fn_input_spans", 4, "ProvenanceSpan", "repeated"),
    ],
    "Chunk": [
        ("encoded_text", 1, "EncodedTextChunk", "oneof:chunk"),
        ("image", 2, "ImageChunk", "oneof:chunk"),
        ("dmel", 3, "DmelChunk", "oneof:chunk"),
    ],
    "EncodedTextChunk": [("tokens", 1, "bytes", "")],
    "ImageChunk": [
        ("data", 1, "bytes", ""),
        ("format", 2, "string", ""),
        ("expected_tokens", 3, "int32", "optional"),
        ("override_dimensions", 4, "ImageDimensions", "optional"),
    ],
    "ImageDimensions": [("width", 1, "uint32", ""), ("height", 2, "uint32", "")],
    "DmelChunk": [("dmel", 1, "bytes", "")],
    "Tensor": [
        ("dense", 1, "bytes", "oneof:encoding"),
        ("sparse_csr", 2, "SparseCsr", "oneof:encoding"),
        ("dtype", 3, "DType", ""),
        ("shape", 4, "int64", "repeated"),
    ],
    "SparseCsr": [
        ("values", 1, "bytes", ""),
        ("crow_indices", 2, "bytes", ""),
        ("col_indices", 3, "bytes", ""),
    ],
    "ProvenanceSpan": [
        ("prompt_tokens", 1, "PromptProvenanceSpan", "oneof:span"),
        ("sampled_tokens", 2, "SampledProvenanceSpan", "oneof:span"),
    ],
    "PromptProvenanceSpan": [
        ("sequence_id", 1, "string", ""),
        ("offset", 2, "int64", ""),
        ("length", 3, "int64", ""),
    ],
    "SampledProvenanceSpan": [
        ("sequence_id", 1, "string", ""),
        ("offset", 2, "int64", ""),
        ("length", 3, "int64", ""),
    ],
    "ForwardBackwardOutput": [
        ("loss_fn_output_type", 1, "string", ""),
        ("loss_fn_outputs", 2, "ArrayRecord", "repeated"),
        ("metrics", 3, "double", "map:string"),
    ],
    "ArrayRecord": [
        ("type_tag", 1, "string", ""),
        ("fields", 2, "BatchedTensor", "map:string"),
        ("num_datums", 3, "int64", ""),
    ],
    "BatchedTensor": [
        ("data", 1, "bytes", ""),
        ("offsets", 2, "bytes", ""),
        ("dtype", 3, "DType", ""),
        ("trailing_shape", 4, "int64", "repeated"),
    ],
    "SampleResponse": [
        ("sequences", 1, "SampledSequence", "repeated"),
        ("prompt_logprobs", 2, "bytes", "optional"),
        ("topk_prompt_logprobs", 3, "TopkLogprobs", "optional"),
        ("prompt_cache_hit_tokens", 4, "int32", ""),
        ("target_prompt_logprobs", 5, "Tensor", "optional"),
        ("prompt_alt_tokens", 6, "PromptAltTokens", "optional"),
    ],
    "PromptAltTokens": [("tokens", 1, "Tensor", ""), ("logprobs", 2, "Tensor", "")],
    "SampledSequence": [
        ("stop_reason", 1, "StopReason", ""),
        ("tokens", 2, "bytes", ""),
        ("logprobs", 3, "bytes", "optional"),
        ("topk_sampled_logprobs", 4, "TopkLogprobs", "optional"),
    ],
    "TopkLogprobs": [
        ("token_ids", 1, "bytes", ""),
        ("logprobs", 2, "bytes", ""),
        ("k", 3, "uint32", ""),
        ("length", 4, "uint32", ""),
    ],
}


def _set_type(field: descriptor_pb2.FieldDescriptorProto, kind: str) -> None:
    if kind in _SCALARS:
        field.type = _SCALARS[kind]
    else:
        field.type = _F.TYPE_ENUM if kind in _ENUMS else _F.TYPE_MESSAGE
        field.type_name = f".{PACKAGE}.{kind}"


def _map_entry(owner: descriptor_pb2.DescriptorProto, name: str, key: str, value: str) -> str:
    """Declare the nested ``<Name>Entry`` message a map field is made of; returns its name."""
    entry = owner.nested_type.add()
    entry.name = "".join(part.capitalize() for part in name.split("_")) + "Entry"
    entry.options.map_entry = True
    for field_name, number, kind in (("key", 1, key), ("value", 2, value)):
        field = entry.field.add(name=field_name, number=number, label=_F.LABEL_OPTIONAL)
        _set_type(field, kind)
    return entry.name


def _message_proto(name: str) -> descriptor_pb2.DescriptorProto:
    message = descriptor_pb2.DescriptorProto(name=name)
    oneofs: list[str] = []
    synthetic: list[descriptor_pb2.FieldDescriptorProto] = []
    for field_name, number, kind, mode in _MESSAGES[name]:
        field = message.field.add(name=field_name, number=number, label=_F.LABEL_OPTIONAL)
        if mode.startswith("map:"):
            field.label = _F.LABEL_REPEATED
            entry = _map_entry(message, field_name, mode[4:], kind)
            field.type, field.type_name = _F.TYPE_MESSAGE, f".{PACKAGE}.{name}.{entry}"
            continue
        _set_type(field, kind)
        if mode == "repeated":
            field.label = _F.LABEL_REPEATED
        elif mode.startswith("oneof:"):
            if mode[6:] not in oneofs:
                oneofs.append(mode[6:])
            field.oneof_index = oneofs.index(mode[6:])
        elif mode == "optional":
            synthetic.append(field)
    # proto3 `optional` is a one-field oneof named "_<field>", declared after the real ones.
    for field in synthetic:
        field.proto3_optional = True
        field.oneof_index = len(oneofs)
        oneofs.append(f"_{field.name}")
    for oneof in oneofs:
        message.oneof_decl.add(name=oneof)
    return message


@cache
def _pool() -> descriptor_pool.DescriptorPool:
    schema = descriptor_pb2.FileDescriptorProto(
        name="twinkle_tinker_wire.proto", package=PACKAGE, syntax="proto3"
    )
    for enum_name, values in _ENUMS.items():
        enum = schema.enum_type.add(name=enum_name)
        for value_name, number in values:
            enum.value.add(name=value_name, number=number)
    for name in _MESSAGES:
        schema.message_type.append(_message_proto(name))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(schema)
    return pool


@cache
def message(name: str) -> type[Message]:
    """The message class called ``name`` in the schema above."""
    if name not in _MESSAGES:
        raise KeyError(f"no message {name!r} in the Tinker wire schema")
    return message_factory.GetMessageClass(_pool().FindMessageTypeByName(f"{PACKAGE}.{name}"))
