"""Tests for twinkle.data_format: validation, dict-style access and the JSON wire form."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from pydantic import ValidationError

from twinkle.data_format import (
    ARRAY_KEY,
    DataModel,
    InputFeature,
    Message,
    ModelOutput,
    SampledSequence,
    SampleResponse,
    SamplingParams,
    Tool,
    ToolCall,
    Trajectory,
    from_jsonable,
    to_jsonable,
)


class FakeTensor:
    """Quacks like a torch tensor (detach/cpu/numpy, shape, is_floating_point) so the tests
    need no torch. ``bfloat16=True`` makes ``numpy()`` fail the way torch's does."""

    def __init__(self, data: Any, bfloat16: bool = False) -> None:
        self._array = np.asarray(data)
        self.shape = self._array.shape
        self.bfloat16 = bfloat16

    def detach(self) -> FakeTensor:
        return self

    def cpu(self) -> FakeTensor:
        return self

    def numpy(self) -> np.ndarray:
        if self.bfloat16:
            raise TypeError("Got unsupported ScalarType BFloat16")
        return self._array

    def float(self) -> FakeTensor:
        return FakeTensor(self._array.astype(np.float32))

    def is_floating_point(self) -> bool:
        return self._array.dtype.kind == "f"


class ArrayOnly:
    """Exposes data only through ``__array__``, like array types that are not tensors."""

    def __init__(self, data: Any) -> None:
        self._data = data

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self._data, dtype=dtype)


def _trajectory() -> Trajectory:
    return Trajectory(
        messages=[
            {"role": "system", "content": "You are a helpful assistant"},
            Message(role="user", content=[{"type": "text", "text": "Make 24 from 3 8 1"}]),
            Message(
                role="assistant",
                content="",
                reasoning_content="think",
                tool_calls=[ToolCall(id="c1", name="calc", arguments={"expr": "3*8*1"})],
            ),
            Message(role="tool", content="24", tool_call_id="c1", name="calc"),
            Message(role="assistant", content="<answer>3*8*1</answer>"),
        ],
        tools=[Tool(name="calc", description="evaluate", parameters={"type": "object"})],
        user_data=[{"target": 24, "nums": [3, 8, 1]}],
    )


def _feature() -> InputFeature:
    return InputFeature(
        input_ids=[1, 2, 3, 4],
        labels=[-100, -100, 3, 4],
        position_ids=np.arange(4, dtype=np.int32),
        attention_mask=np.ones(4, dtype=bool),
        messages=_trajectory().messages,
        user_data=[{"target": 24, "nums": [3, 8, 1]}],
        advantages=np.array([0.5, -0.5], dtype=np.float32),
        old_logps=[-0.1, -0.2],
    )


def _sequence() -> SampledSequence:
    return SampledSequence(
        tokens=[3, 4],
        logprobs=[[(3, -0.1), (9, -2.5)], [(4, -0.2)]],
        stop_reason="stop",
        text="ab",
        new_input_feature=_feature(),
    )


EXAMPLES = [
    Tool(name="calc", parameters={"type": "object", "properties": {}}),
    ToolCall(name="calc", arguments='{"expr": "1+1"}'),
    Message(role="user", content="hi", name="alice"),
    _trajectory(),
    _feature(),
    SamplingParams(max_tokens=8, temperature=0.7, stop=["\n"], seed=1, logprobs=1),
    SamplingParams(max_tokens=8, stop=[151645]),
    SamplingParams(max_tokens=8, stop="</answer>", top_k=20, prompt_logprobs=0),
    _sequence(),
    SampleResponse(sequences=[_sequence()], prompt_logprobs=[None, [(2, -1.5)]]),
    ModelOutput(
        logits=np.zeros((1, 4, 8), dtype=np.float16), logps=[[-0.5, -1.0]], loss=2.5, aux=[1]
    ),
]


def test_import_does_not_import_torch() -> None:
    code = "import sys, twinkle.data_format; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- JSON round trips ---------------------------------------------------------------------


@pytest.mark.parametrize("model", EXAMPLES, ids=lambda m: type(m).__name__)
def test_json_round_trip(model: DataModel) -> None:
    text = model.to_json()
    back = type(model).from_json(text)
    assert back == model
    assert json.loads(text) == model.to_dict()
    assert type(model).from_dict(model.to_dict()) == model


def test_round_trip_restores_nested_classes_and_arrays() -> None:
    response = SampleResponse.from_json(SampleResponse(sequences=[_sequence()]).to_json())
    seq = response.sequences[0]
    assert isinstance(seq, SampledSequence)
    feature = seq.new_input_feature
    assert isinstance(feature, InputFeature)
    assert all(isinstance(m, Message) for m in feature.messages)
    assert isinstance(feature.messages[2].tool_calls[0], ToolCall)
    assert feature.position_ids.dtype == np.int32
    assert feature.attention_mask.dtype == np.bool_
    assert feature.advantages.dtype == np.float32 and feature.advantages.shape == (2,)
    assert feature.old_logps == [-0.1, -0.2]  # a list extra stays a list
    assert seq.logprobs[0][1] == (9, -2.5)


def test_array_wire_form() -> None:
    encoded = to_jsonable(np.arange(6, dtype=np.int16).reshape(2, 3))
    assert encoded == {ARRAY_KEY: {"dtype": "int16", "shape": [2, 3], "data": [0, 1, 2, 3, 4, 5]}}


_DTYPES = st.sampled_from(["bool", "int8", "int32", "int64", "uint8", "float16", "float32"])


@given(hnp.arrays(dtype=_DTYPES, shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0)))
def test_arrays_round_trip_with_dtype_and_shape(array: np.ndarray) -> None:
    back = from_jsonable(json.loads(json.dumps(to_jsonable({"x": [array]}))))["x"][0]
    assert isinstance(back, np.ndarray)
    assert back.dtype == array.dtype
    assert back.shape == array.shape
    np.testing.assert_array_equal(back, array)


_JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False)
    | st.text()
    | hnp.arrays(dtype=_DTYPES, shape=hnp.array_shapes(min_dims=1, max_dims=2))
)
_JSON_VALUES = st.recursive(
    _JSON_LEAVES,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text().filter(lambda k: k != ARRAY_KEY), inner, max_size=3)
    ),
    max_leaves=10,
)


@given(_JSON_VALUES)
def test_wire_form_is_stable_through_json(value: Any) -> None:
    text = json.dumps(to_jsonable(value))  # compared as text, where NaN equals NaN
    assert json.dumps(to_jsonable(from_jsonable(json.loads(text)))) == text


@given(
    tokens=st.lists(st.integers(0, 200_000), max_size=20),
    reason=st.sampled_from(["stop", "length", "abort"]),
    logprob=st.floats(max_value=0.0, allow_nan=False, allow_infinity=False),
)
def test_sampled_sequence_round_trip(tokens: list[int], reason: str, logprob: float) -> None:
    seq = SampledSequence(
        tokens=tokens, logprobs=[[(t, logprob)] for t in tokens], stop_reason=reason
    )
    back = SampledSequence.from_json(seq.to_json())
    assert back == seq
    assert [lp[0][1] for lp in back.logprobs] == [logprob] * len(tokens)


# --- attribute and key access -------------------------------------------------------------


def test_documents_reward_reads_work_on_a_sampled_feature() -> None:
    # The reading code of the Countdown reward in the user's guide, run on new_input_feature.
    trajectory = _sequence().new_input_feature
    messages = trajectory.get("messages", [])
    completion = ""
    for msg in reversed(messages):
        if msg.get("role") == "assistant":
            completion = msg.get("content", "")
            break
    user_data = trajectory.get("user_data", [{}])
    data = user_data[0] if isinstance(user_data, list) and user_data else {}
    assert completion == "<answer>3*8*1</answer>"
    assert (data.get("target", 0), data.get("nums", [])) == (24, [3, 8, 1])


def test_attribute_and_key_access_agree() -> None:
    response = SampleResponse(sequences=[_sequence()])
    seq = response.get("sequences", [])[0]
    assert seq.get("new_input_feature", seq) is seq.new_input_feature
    assert seq.get("logprobs", []) is seq["logprobs"] is seq.logprobs
    assert len(seq.get("tokens", [])) == 2
    assert [lp[0][1] for lp in seq.logprobs] == [-0.1, -0.2]
    feature = seq.new_input_feature
    assert feature["input_ids"].tolist() == [1, 2, 3, 4]
    assert feature["input_ids"].dtype == np.int64
    assert "labels" in feature and "nope" not in feature


def test_unset_fields_are_absent_keys() -> None:
    feature = InputFeature(input_ids=[1, 2])
    assert feature.labels is None
    assert "labels" not in feature
    assert feature.get("labels", "missing") == "missing"
    assert list(feature) == list(feature.keys()) == ["input_ids", "length"]
    assert dict(feature) == {"input_ids": feature.input_ids, "length": 2}
    assert list(feature.values())[1] == 2
    with pytest.raises(KeyError, match="'labels' is not set"):
        feature["labels"]
    with pytest.raises(KeyError, match="no key 'nope'.*input_ids"):
        feature["nope"]
    assert Trajectory(messages=[]).get("user_data", [{}]) == []


def test_setitem_validates_like_the_constructor() -> None:
    msg = Message(role="user", content="hi")
    msg["content"] = "bye"
    assert msg.content == "bye"
    with pytest.raises(ValidationError, match="role"):
        msg["role"] = "bot"
    assert msg.role == "user"
    with pytest.raises(KeyError, match="no field 'weight'.*role"):
        msg["weight"] = 1.0


def test_failed_assignment_leaves_the_object_unchanged() -> None:
    feature = _feature()
    with pytest.raises(ValidationError, match="labels has 4 tokens but input_ids has 2"):
        feature["input_ids"] = [7, 8]
    assert feature.input_ids.tolist() == [1, 2, 3, 4]
    assert feature.length == 4


def test_update_changes_agreeing_fields_together() -> None:
    feature = _feature()
    feature.update(input_ids=[7, 8], labels=[-100, 8], position_ids=[0, 1], attention_mask=None)
    assert feature.length == 2  # derived again
    assert feature.labels.tolist() == [-100, 8]
    assert "attention_mask" not in feature
    with pytest.raises(ValidationError, match="length is 5 but input_ids has 2"):
        feature.update({"length": 5})
    assert feature.length == 2


# --- extra keys ---------------------------------------------------------------------------


def test_input_feature_and_model_output_take_extra_keys() -> None:
    feature = InputFeature(input_ids=[1, 2], old_logps=[-0.1, -0.2])
    feature["advantages"] = 0.5
    feature.ref_logps = FakeTensor([-1.0, -2.0])
    assert feature["old_logps"] == [-0.1, -0.2]
    assert feature.advantages == 0.5
    assert set(feature.keys()) >= {"old_logps", "advantages", "ref_logps"}
    back = InputFeature.from_json(feature.to_json())
    assert back.ref_logps.tolist() == [-1.0, -2.0]
    output = ModelOutput(loss=1.5, entropy=[0.3])
    output["kl"] = 0.1
    assert (output.get("kl"), output["entropy"]) == (0.1, [0.3])


@pytest.mark.parametrize(
    ("cls", "kwargs", "key"),
    [
        (Message, {"role": "user", "content": "x", "weight": 1}, "weight"),
        (SamplingParams, {"max_tokens": 8, "max_new_tokens": 8}, "max_new_tokens"),
        (Trajectory, {"messages": [], "answer": 3}, "answer"),
        (SampledSequence, {"tokens": [], "stop_reason": "stop", "score": 1}, "score"),
    ],
)
def test_other_types_reject_unknown_keys(cls: type[DataModel], kwargs: dict, key: str) -> None:
    with pytest.raises(ValidationError, match=f"{key}\n.*Extra inputs are not permitted"):
        cls(**kwargs)


# --- bad inputs ---------------------------------------------------------------------------

_BAD = [
    (Message, {"role": "bot", "content": "x"}, ["role", "'system', 'user', 'assistant'", "tool"]),
    (Message, {"role": "user", "content": 5}, ["content", "must be a str or a list", "got int"]),
    (Message, {"role": "user", "content": None}, ["content", "got NoneType"]),
    (Message, {"role": "user", "content": [{"text": "x"}]}, ["content[0]", "'type' key"]),
    (
        Message,
        {"role": "user", "tool_calls": [{"name": "f"}]},
        ["tool_calls is only allowed on assistant"],
    ),
    (Message, {"role": "assistant", "tool_call_id": "c"}, ["tool_call_id is only allowed on tool"]),
    (Message, {"role": "user", "reasoning_content": "r"}, ["reasoning_content is only allowed"]),
    (ToolCall, {"name": "f", "arguments": 5}, ["arguments", "JSON string or a dict"]),
    (ToolCall, {"name": ""}, ["name", "at least 1 character"]),
    (Tool, {"type": "retrieval", "function": {"name": "f"}}, ["type must be 'function'"]),
    (Tool, {"type": "function", "function": "f"}, ["'function' must be a dict, got str"]),
    (Trajectory, {"messages": [{"role": "bot"}]}, ["messages.0.role", "'assistant'"]),
    (Trajectory, {"messages": [], "user_data": {"target": 1}}, ["user_data", "valid list"]),
    (SamplingParams, {"max_tokens": "5"}, ["max_tokens", "valid integer"]),
    (SamplingParams, {"max_tokens": 5.0}, ["max_tokens", "valid integer"]),
    (SamplingParams, {"max_tokens": 0}, ["max_tokens", "greater than or equal to 1"]),
    (SamplingParams, {"max_tokens": 8, "temperature": -0.1}, ["temperature", "greater than or"]),
    (SamplingParams, {"max_tokens": 8, "temperature": "1"}, ["temperature", "valid number"]),
    (SamplingParams, {"max_tokens": 8, "temperature": True}, ["temperature", "valid number"]),
    (SamplingParams, {"max_tokens": 8, "top_p": 0.0}, ["top_p", "greater than 0"]),
    (SamplingParams, {"max_tokens": 8, "top_p": 1.5}, ["top_p", "less than or equal to 1"]),
    (SamplingParams, {"max_tokens": 8, "top_k": 0}, ["top_k", "-1 (disabled) or a positive"]),
    (SamplingParams, {"max_tokens": 8, "num_samples": 0}, ["num_samples", "greater than or"]),
    (SamplingParams, {"max_tokens": 8, "logprobs": -1}, ["logprobs", "greater than or"]),
    (SamplingParams, {"max_tokens": 8, "stop": ["a", 1]}, ["stop", "not a mix"]),
    (SamplingParams, {"max_tokens": 8, "stop": [True]}, ["stop", "token ids"]),
    (SampledSequence, {"tokens": [1], "stop_reason": "eos"}, ["stop_reason", "'length'"]),
    (SampledSequence, {"tokens": ["a"], "stop_reason": "stop"}, ["tokens.0", "valid integer"]),
    (
        SampledSequence,
        {"tokens": [1, 2], "logprobs": [[(1, -0.1)]], "stop_reason": "stop"},
        ["logprobs has 1 entries but tokens has 2"],
    ),
    (
        SampledSequence,
        {"tokens": [1], "logprobs": [[(5, -0.1)]], "stop_reason": "stop"},
        ["logprobs[0] must start with the sampled token 1, got 5"],
    ),
    (
        SampledSequence,
        {"tokens": [1], "logprobs": [[(1, "-0.1")]], "stop_reason": "stop"},
        ["logprobs.0.0.1", "valid number"],
    ),
    (SampleResponse, {"sequences": [{"tokens": [1]}]}, ["sequences.0.stop_reason", "required"]),
    (InputFeature, {"labels": [1]}, ["input_ids", "required"]),
    (InputFeature, {"input_ids": [1, 2], "labels": [1]}, ["labels has 1 tokens", "input_ids"]),
    (InputFeature, {"input_ids": [1], "position_ids": [0, 1]}, ["position_ids has 2 tokens"]),
    (
        InputFeature,
        {"input_ids": [[1, 2]], "attention_mask": [[1, 1, 1]]},
        ["attention_mask has 3 tokens but input_ids has 2"],
    ),
    (InputFeature, {"input_ids": [1, 2], "length": 3}, ["length is 3 but input_ids has 2"]),
    (InputFeature, {"input_ids": [1, 2], "length": "2"}, ["length", "valid integer"]),
    (InputFeature, {"input_ids": [1.0, 2.0]}, ["input_ids must hold integers", "float64"]),
    (InputFeature, {"input_ids": [True]}, ["input_ids must hold integers", "bool"]),
    (InputFeature, {"input_ids": "1 2"}, ["input_ids must be a list", "got str"]),
    (InputFeature, {"input_ids": [[1], [2, 3]]}, ["input_ids must be a rectangular list"]),
    (InputFeature, {"input_ids": np.int64(3)}, ["input_ids must be a list", "got int64"]),
    (InputFeature, {"input_ids": np.array(3)}, ["input_ids must have at least one dimension"]),
    (InputFeature, {"input_ids": np.zeros(2)}, ["input_ids must hold integers", "float64"]),
    (InputFeature, {"input_ids": FakeTensor([0.5])}, ["input_ids", "floating point tensor"]),
    (InputFeature, {"input_ids": [1], "messages": [{"role": "x"}]}, ["messages.0.role"]),
    (ModelOutput, {"logps": ["a"]}, ["logps must hold numbers"]),
    (ModelOutput, {"loss": [1.0]}, ["loss must be a number, an array or a tensor", "list"]),
    (ModelOutput, {"loss": True}, ["loss must be a number", "bool"]),
]


@pytest.mark.parametrize(
    ("cls", "kwargs", "needles"), _BAD, ids=[f"{cls.__name__}:{n[0]}" for cls, _, n in _BAD]
)
def test_bad_input_fails_with_a_message_naming_the_problem(
    cls: type[DataModel], kwargs: dict, needles: list[str]
) -> None:
    with pytest.raises(ValidationError) as info:
        cls(**kwargs)
    for needle in needles:
        assert needle in str(info.value)


# --- conversions ----------------------------------------------------------------------------


def test_dicts_become_models() -> None:
    trajectory = Trajectory(messages=[{"role": "user", "content": "hi"}])
    assert isinstance(trajectory.messages[0], Message)
    response = SampleResponse(
        sequences=[
            {"tokens": [1], "stop_reason": "length", "new_input_feature": {"input_ids": [1]}}
        ]
    )
    assert isinstance(response.sequences[0], SampledSequence)
    assert isinstance(response.sequences[0].new_input_feature, InputFeature)
    # The client passes sampling parameters as a plain dict.
    params = SamplingParams.model_validate({"max_tokens": 16, "top_p": 0.95})
    assert (params.max_tokens, params.top_p, params.top_k, params.num_samples) == (16, 0.95, -1, 1)


def test_openai_tool_forms_are_accepted_and_produced() -> None:
    tool = Tool.model_validate(
        {"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}
    )
    assert (tool.name, tool.parameters) == ("calc", {"type": "object"})
    assert Tool.model_validate(tool.to_openai()) == tool
    call = ToolCall.model_validate(
        {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{}"}}
    )
    assert (call.id, call.name, call.arguments) == ("c1", "calc", "{}")
    assert call.to_openai() == {
        "id": "c1",
        "type": "function",
        "function": {"name": "calc", "arguments": "{}"},
    }
    message = Message(role="assistant", tool_calls=[call]).to_openai()
    assert message == {"role": "assistant", "content": "", "tool_calls": [call.to_openai()]}


def test_lists_become_numpy_while_arrays_and_tensors_are_kept() -> None:
    mask = np.ones(3, dtype=np.int8)
    tensor = FakeTensor([1, 2, 3])
    feature = InputFeature(input_ids=tensor, labels=(-100, 2, 3), attention_mask=mask)
    assert feature.input_ids is tensor
    assert feature.attention_mask is mask
    assert isinstance(feature.labels, np.ndarray) and feature.labels.dtype == np.int64
    assert feature.length == 3
    assert InputFeature(input_ids=[]).input_ids.dtype == np.int64
    back = InputFeature.from_json(feature.to_json())
    assert isinstance(back.input_ids, np.ndarray) and back.input_ids.tolist() == [1, 2, 3]
    assert back == feature  # tensors compare by value


def test_objects_with_only_array_interface_become_numpy() -> None:
    feature = InputFeature(input_ids=ArrayOnly([4, 5]))
    assert isinstance(feature.input_ids, np.ndarray) and feature.input_ids.tolist() == [4, 5]
    wire = to_jsonable({"x": ArrayOnly(np.ones(2, dtype=np.uint8)), "y": np.float32(1.5)})
    assert wire["x"][ARRAY_KEY]["dtype"] == "uint8"
    assert wire["y"] == 1.5 and type(wire["y"]) is float


def test_batched_features_check_the_last_axis() -> None:
    feature = InputFeature(input_ids=np.zeros((2, 5), dtype=np.int64), position_ids=[[0] * 5] * 3)
    assert feature.length == 5
    assert feature.position_ids.shape == (3, 5)


def test_model_output_fields() -> None:
    loss = FakeTensor(np.float32(2.0))
    output = ModelOutput(logits=np.zeros((1, 2), dtype=np.int32), logps=[[-1, -2]], loss=loss)
    assert output.loss is loss
    assert output.logps.dtype == np.float64
    assert output.logits.dtype == np.int32
    assert ModelOutput(loss=3).loss == 3.0 and isinstance(ModelOutput(loss=3).loss, float)
    assert ModelOutput(loss=np.float32(0.5)).loss == 0.5
    assert "loss" not in ModelOutput(loss=None)
    back = ModelOutput.from_json(output.to_json())
    assert back.loss.shape == () and float(back.loss) == 2.0


def test_bfloat16_tensors_travel_as_float32() -> None:
    wire = to_jsonable(FakeTensor(np.array([0.5, 1.5], dtype=np.float32), bfloat16=True))
    assert wire[ARRAY_KEY]["dtype"] == "float32"
    assert wire[ARRAY_KEY]["data"] == [0.5, 1.5]


def test_models_differ_when_values_differ() -> None:
    assert InputFeature(input_ids=[1, 2]) != InputFeature(input_ids=[1, 3])
    assert InputFeature(input_ids=[1, 2]) != InputFeature(input_ids=np.array([1, 2], np.int32))
    assert Message(role="user", content="a") != Message(role="user", content="b")
    assert Message(role="user", content="a") != {"role": "user", "content": "a"}
    assert InputFeature(input_ids=[1], x=[1]) != InputFeature(input_ids=[1], x=np.array([1]))


# --- the wire form rejects what it cannot represent faithfully ------------------------------


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        ({"dtype": "object", "shape": [1], "data": [1]}, "dtype 'object'"),
        ({"dtype": "nope", "shape": [1], "data": [1]}, "unknown dtype 'nope'"),
        ({"dtype": None, "shape": [1], "data": [1]}, "dtype must be a string"),
        ({"dtype": "int64", "shape": [2], "data": [1]}, "1 values but shape [2]"),
        ({"dtype": "int64", "shape": [-1], "data": []}, "non-negative ints"),
        ({"dtype": "int64", "shape": [1], "data": [1.5]}, "does not hold int64"),
        ({"dtype": "int8", "shape": [1], "data": [300]}, "does not fit in int8"),
        ({"dtype": "bool", "shape": [1], "data": [1]}, "does not hold bool"),
        ({"dtype": "float32", "shape": [1], "data": ["x"]}, "does not hold float32"),
        ({"dtype": "int64", "shape": [2], "data": [[1], [2, 3]]}, "flat list of numbers"),
        ({"dtype": "int64", "shape": [1]}, "dtype, shape and data"),
        ({"dtype": "int64", "shape": [1], "data": "1"}, "data must be a flat list"),
    ],
)
def test_decoding_rejects_bad_array_payloads(payload: dict, needle: str) -> None:
    with pytest.raises(ValueError) as info:
        from_jsonable({ARRAY_KEY: payload})
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("value", "error", "needle"),
    [
        ({1: "a"}, TypeError, "keys must be strings"),
        ({"x": object()}, TypeError, "cannot encode a object"),
        ({ARRAY_KEY: 1}, ValueError, "reserved for arrays"),
        (np.array(["a"]), TypeError, "dtype <U1"),
    ],
)
def test_encoding_rejects_what_json_cannot_hold(value: Any, error: type, needle: str) -> None:
    with pytest.raises(error) as info:
        to_jsonable(value)
    assert needle in str(info.value)
