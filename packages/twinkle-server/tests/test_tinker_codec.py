"""The Tinker wire codecs against the SDK's own serializers: requests encoded by the SDK
decode here, and what we encode decodes with the SDK's response readers. No server."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from tinker import types
from tinker.proto import tinker_public_pb2 as sdk_pb
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.proto.response_conv import (
    deserialize_forward_backward_output,
    deserialize_sample_response,
)
from tinker.types._pydantic_types.datum import Datum as JsonDatum

from twinkle.server.config import Limits
from twinkle.server.errors import BadRequest
from twinkle.server.tinker import proto_schema
from twinkle.server.tinker.codec import (
    RejectedRequest,
    decode_forward_backward,
    encode_forward_backward_output,
)
from twinkle.server.tinker.sample_codec import (
    PromptScores,
    TinkerSequence,
    encode_sample_response,
)

PROTO = "application/x-protobuf"
LIMITS = Limits()


def field_table(descriptor) -> dict:
    return {
        f.name: (
            f.number,
            f.type,
            f.is_repeated,
            f.has_presence,
            f.containing_oneof.name if f.containing_oneof else None,
            f.message_type.name if f.message_type else None,
            f.enum_type.name if f.enum_type else None,
        )
        for f in descriptor.fields
    }


@pytest.mark.parametrize("name", sorted(proto_schema._MESSAGES))
def test_our_schema_matches_the_sdk_descriptor_field_for_field(name):
    ours = proto_schema.message(name).DESCRIPTOR
    assert field_table(ours) == field_table(getattr(sdk_pb, name).DESCRIPTOR)
    for field in ours.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            sdk_entry = getattr(sdk_pb, name).DESCRIPTOR.fields_by_name[field.name].message_type
            assert field_table(field.message_type) == field_table(sdk_entry)


def sdk_body(data, loss_fn="cross_entropy", config=None, forward_only=False, seq_id=3) -> bytes:
    """A forward_backward body exactly as the 0.38 SDK builds it (resources/training.py)."""
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(
            data=data, loss_fn=loss_fn, loss_fn_config=config
        ),
        model_id="sess-1:train:0",
        seq_id=seq_id,
    )
    msg = forward_backward_request_to_proto(request)
    msg.forward_only = forward_only
    return msg.SerializeToString()


def test_an_sdk_protobuf_request_decodes_to_dense_arrays():
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints([11, 12, 13]),
            loss_fn_inputs={"target_tokens": [12, 13, 14], "weights": [0.0, 1.0, -2.5]},
        ),
        types.Datum(
            model_input=types.ModelInput(
                chunks=[
                    types.EncodedTextChunk(tokens=[5]),
                    types.EncodedTextChunk(tokens=[6, 7]),
                ]
            ),
            loss_fn_inputs={
                "target_tokens": np.array([6, 7, 8]),
                "logprobs": np.array([-0.5, -1.5, -2.5], dtype=np.float32),
                "advantages": torch.tensor([1.0, 1.0, -1.0]),
            },
        ),
    ]
    config = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2, "mode": "fast"}
    request = decode_forward_backward(sdk_body(data, "ppo", config, seq_id=7), PROTO, LIMITS)
    assert (request.model_id, request.seq_id, request.loss_fn) == ("sess-1:train:0", 7, "ppo")
    assert request.loss_fn_config == config and not request.forward_only
    first, second = request.data
    assert first.tokens == [11, 12, 13] and second.tokens == [5, 6, 7]
    assert first.inputs["target_tokens"].dtype == np.int64
    assert first.inputs["target_tokens"].tolist() == [12, 13, 14]
    assert first.inputs["weights"].tolist() == [0.0, 1.0, -2.5]
    assert second.inputs["advantages"].tolist() == [1.0, 1.0, -1.0]
    assert second.inputs["logprobs"].dtype == np.float32


def test_forward_only_and_the_legacy_config_map_decode():
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2]),
        loss_fn_inputs={"target_tokens": [2, 3], "weights": [1.0, 1.0]},
    )
    msg = sdk_pb.ForwardBackwardRequest.FromString(sdk_body([datum], "dro", {"beta": 0.1}))
    msg.ClearField("loss_fn_config_v2")  # a client that writes only the old map
    msg.forward_only = True
    request = decode_forward_backward(msg.SerializeToString(), PROTO, LIMITS)
    assert request.loss_fn_config == {"beta": pytest.approx(0.1)} and request.forward_only


def test_two_dimensional_torch_inputs_travel_as_sparse_csr_and_come_back_dense():
    targets = torch.zeros((2, 40), dtype=torch.long)
    weights = torch.zeros((2, 40))
    targets[0, 3], targets[1, 39], weights[0, 3], weights[1, 39] = 3, 9, 0.5, 2.0
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2]),
        loss_fn_inputs={"target_tokens": targets, "weights": weights},
    )
    body = sdk_body([datum])
    sent = sdk_pb.ForwardBackwardRequest.FromString(body).data[0].loss_fn_inputs
    assert sent["target_tokens"].WhichOneof("encoding") == "sparse_csr"  # what we must read
    inputs = decode_forward_backward(body, PROTO, LIMITS).data[0].inputs
    assert inputs["target_tokens"].tolist() == targets.tolist()
    assert inputs["weights"].tolist() == weights.tolist()


def legacy_body(input_key: str) -> dict:
    """A 0.16.1 body: pydantic models dumped with exclude_unset, as that SDK sends them."""
    datum = JsonDatum(
        model_input={"chunks": [{"tokens": [4, 5, 6]}]},
        loss_fn_inputs={"target_tokens": [5, 6, 7], "weights": [1.0, 0.0, 1.0]},
    )
    payload = {
        "data": [datum.model_dump(exclude_unset=True, mode="json")],
        "loss_fn": "cross_entropy",
    }
    return {input_key: payload, "model_id": "sess-1:train:0", "seq_id": 2}


def test_sdk_0_16_json_bodies_of_forward_backward_and_forward_decode():
    body = legacy_body("forward_backward_input")
    chunk = body["forward_backward_input"]["data"][0]["model_input"]["chunks"][0]
    assert "type" not in chunk  # 0.16.1 leaves the default chunk type out
    request = decode_forward_backward(json.dumps(body).encode(), "application/json", LIMITS)
    assert (request.seq_id, request.loss_fn, request.forward_only) == (2, "cross_entropy", False)
    assert request.data[0].tokens == [4, 5, 6]
    assert request.data[0].inputs["weights"].tolist() == [1.0, 0.0, 1.0]
    forward = decode_forward_backward(
        json.dumps(legacy_body("forward_input")).encode(), None, LIMITS
    )
    assert forward.forward_only and forward.loss_fn_config == {}


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda m: m.data[0].model_input.add().image.SetInParent(), "text only"),
        (lambda m: setattr(m, "loss_fn", ""), "loss_fn"),
        (lambda m: m.ClearField("data"), "no data"),
        (lambda m: m.data[0].loss_fn_inputs["weights"].shape.append(5), "shape"),
        (
            lambda m: setattr(
                m.data[0].loss_fn_inputs["weights"], "dtype", proto_schema.DTYPE_UNSPECIFIED
            ),
            "dtype",
        ),
    ],
)
def test_malformed_protobuf_requests_are_user_errors(mutate, message):
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2]),
        loss_fn_inputs={"target_tokens": [2, 3], "weights": [1.0, 1.0]},
    )
    msg = sdk_pb.ForwardBackwardRequest.FromString(sdk_body([datum]))
    mutate(msg)
    with pytest.raises(RejectedRequest, match=message) as caught:
        decode_forward_backward(msg.SerializeToString(), PROTO, LIMITS)
    # The envelope was read: the route can free this seq_id for the model's next requests.
    assert (caught.value.model_id, caught.value.seq_id) == ("sess-1:train:0", 3)


def test_garbage_bodies_are_user_errors():
    with pytest.raises(BadRequest, match="protobuf") as caught:
        decode_forward_backward(b"\xff\xff\xff\xff", PROTO, LIMITS)
    assert not isinstance(caught.value, RejectedRequest)  # no seq_id could be read
    with pytest.raises(BadRequest, match="JSON"):
        decode_forward_backward(b"\xff\xff", "application/json", LIMITS)
    body = {"model_id": "m", "seq_id": 4, "forward_backward_input": {"data": [{}]}}
    with pytest.raises(RejectedRequest, match="model input") as caught:
        decode_forward_backward(json.dumps(body).encode(), "application/json", LIMITS)
    assert (caught.value.model_id, caught.value.seq_id) == ("m", 4)


def test_forward_backward_output_reads_back_with_the_sdk_decoder():
    outputs = [
        {"logprobs": np.array([-1.0, -2.0, -3.0], dtype=np.float32)},
        {"logprobs": np.array([-4.5], dtype=np.float32)},
    ]
    result = encode_forward_backward_output(outputs, {"loss:sum": 10.5})
    decoded = deserialize_forward_backward_output(result.proto)
    assert decoded.metrics == {"loss:sum": 10.5}
    assert decoded.loss_fn_output_type == "ArrayRecord"
    assert [o["logprobs"].tolist() for o in decoded.loss_fn_outputs] == [
        [-1.0, -2.0, -3.0],
        [-4.5],
    ]
    assert decoded.loss_fn_outputs[0]["logprobs"].shape == [3]
    assert result.json["loss_fn_outputs"][1]["logprobs"] == {
        "data": [-4.5],
        "dtype": "float32",
        "shape": [1],
    }
    assert result.json["metrics"] == {"loss:sum": 10.5}


def test_metric_keys_without_exactly_one_colon_are_refused():
    for bad in ("loss", "loss:sum:mean"):
        with pytest.raises(ValueError, match="name:reduction"):
            encode_forward_backward_output([{"logprobs": np.zeros(1, np.float32)}], {bad: 1.0})


def test_sample_response_reads_back_with_the_sdk_decoder():
    sequences = [
        TinkerSequence([7, 8, 9], [-0.1, -0.2, -0.3], "length", topk=[[(7, -0.1), (3, -2.0)]] * 3),
        TinkerSequence([4], [-1.5], "stop"),
    ]
    prompt = PromptScores(
        logprobs=[None, -2.0, -3.0], topk=[None, [(1, -0.5), (2, -1.0)], [(5, -0.25)]]
    )
    result = encode_sample_response(sequences, prompt)
    decoded = deserialize_sample_response(result.proto)
    first, second = decoded.sequences
    assert first.tokens == [7, 8, 9] and first.stop_reason == "length"
    assert first.logprobs == pytest.approx([-0.1, -0.2, -0.3])
    assert first.topk_logprobs[0] == [(7, pytest.approx(-0.1)), (3, -2.0)]
    assert second.tokens == [4] and second.stop_reason == "stop" and second.topk_logprobs is None
    assert decoded.prompt_logprobs == [None, -2.0, -3.0]
    # Row 0 has no context (all cells empty: None); row 2 has fewer than k entries.
    assert decoded.topk_prompt_logprobs == [None, [(1, -0.5), (2, -1.0)], [(5, -0.25)]]
    assert result.json["prompt_logprobs"] == [None, -2.0, -3.0]
    assert result.json["topk_prompt_logprobs"][0] is None
    assert result.json["sequences"][1] == {"stop_reason": "stop", "tokens": [4], "logprobs": [-1.5]}


def test_a_sample_without_prompt_scores_sends_none():
    result = encode_sample_response([TinkerSequence([1], [-0.5], "length")])
    decoded = deserialize_sample_response(result.proto)
    assert decoded.prompt_logprobs is None and decoded.topk_prompt_logprobs is None
    assert "prompt_logprobs" not in result.json
    assert not math.isnan(decoded.sequences[0].logprobs[0])
