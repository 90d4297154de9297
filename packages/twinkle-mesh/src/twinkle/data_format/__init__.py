"""The shared data types every Twinkle package speaks (DESIGN.md section 2), torch-free.

Each type is validated at construction, reads both as attributes and as a dict, and goes
to and from JSON (``to_json``/``from_json``, ``to_dict``/``from_dict``) with arrays and
tensors as typed lists, so no pickle crosses the HTTP boundary.
"""

from twinkle.data_format._arrays import ARRAY_KEY
from twinkle.data_format._base import DataModel, from_jsonable, to_jsonable
from twinkle.data_format.features import InputFeature, ModelOutput
from twinkle.data_format.messages import Message, Role, Tool, ToolCall, Trajectory
from twinkle.data_format.sampling import (
    SampledSequence,
    SampleResponse,
    SamplingParams,
    TopLogprobs,
    sampled_input_features,
)

__all__ = [
    "ARRAY_KEY",
    "DataModel",
    "InputFeature",
    "Message",
    "ModelOutput",
    "Role",
    "SampleResponse",
    "SampledSequence",
    "SamplingParams",
    "TopLogprobs",
    "Tool",
    "ToolCall",
    "Trajectory",
    "from_jsonable",
    "sampled_input_features",
    "to_jsonable",
]
