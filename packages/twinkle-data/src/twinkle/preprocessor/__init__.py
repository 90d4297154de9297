"""Preprocessors turn raw dataset rows into Trajectories; Filters decide which rows stay.

``dataset.map(...)`` takes a registered name (``'SelfCognitionProcessor'``, with
``init_args``), a class, an instance or a plain function ``row -> Trajectory``. Every
built-in preprocessor is registered under its class name; register your own with
``@PREPROCESSORS.register``.

``user_data``, the per-sample data a reward reads and the model never sees, has one shape:
a list holding one dict of ground-truth fields, e.g. ``[{'answer': '42'}]`` (GSM8K) or
``[{'target': 24, 'nums': [3, 8, 1]}]`` (Countdown). Read it back with
``trajectory.get('user_data', [{}])[0].get('target')``.
"""

from twinkle.preprocessor.alpaca import AlpacaProcessor
from twinkle.preprocessor.base import (
    FILTERS,
    PREPROCESSORS,
    Filter,
    Preprocessor,
    RowFieldError,
    require,
)
from twinkle.preprocessor.llm import CountdownProcessor, GSM8KProcessor
from twinkle.preprocessor.messages import MessagesProcessor
from twinkle.preprocessor.resolve import (
    FunctionFilter,
    FunctionPreprocessor,
    build_filter,
    build_preprocessor,
)
from twinkle.preprocessor.self_cognition import SelfCognitionProcessor

__all__ = [
    "FILTERS",
    "PREPROCESSORS",
    "AlpacaProcessor",
    "CountdownProcessor",
    "Filter",
    "FunctionFilter",
    "FunctionPreprocessor",
    "GSM8KProcessor",
    "MessagesProcessor",
    "Preprocessor",
    "RowFieldError",
    "SelfCognitionProcessor",
    "build_filter",
    "build_preprocessor",
    "require",
]
