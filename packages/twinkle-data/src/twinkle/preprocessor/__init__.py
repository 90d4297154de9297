"""Preprocessors turn raw dataset rows into Trajectories; Filters decide which rows stay.

``dataset.map(...)`` takes a registered name (``'SelfCognitionProcessor'``, with
``init_args``), a class, an instance or a plain function ``row -> Trajectory``. Every
built-in preprocessor is registered under its class name; register your own with
``@PREPROCESSORS.register``.

``encode()`` on rows no ``map`` converted uses :class:`AutoPreprocessor`, which knows the
common raw shapes (``messages``, ShareGPT ``conversations``, Alpaca, ``query``/``response``;
see ``ROW_SHAPES``) and names a row's fields and those shapes when it matches none.

``user_data``, the per-sample data a reward reads and the model never sees, has one shape:
a list holding one dict of ground-truth fields, e.g. ``[{'answer': '42'}]`` (GSM8K) or
``[{'target': 24, 'nums': [3, 8, 1]}]`` (Countdown). Read it back with
``trajectory.get('user_data', [{}])[0].get('target')``.
"""

from twinkle.preprocessor.alpaca import AlpacaProcessor
from twinkle.preprocessor.auto import (
    ROW_SHAPES,
    AutoPreprocessor,
    UnknownRowShapeError,
    row_shape,
)
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
from twinkle.preprocessor.query_response import QueryResponseProcessor
from twinkle.preprocessor.resolve import (
    FunctionFilter,
    FunctionPreprocessor,
    build_filter,
    build_preprocessor,
)
from twinkle.preprocessor.self_cognition import SelfCognitionProcessor
from twinkle.preprocessor.sharegpt import SHAREGPT_ROLES, ShareGPTProcessor

__all__ = [
    "FILTERS",
    "PREPROCESSORS",
    "ROW_SHAPES",
    "SHAREGPT_ROLES",
    "AlpacaProcessor",
    "AutoPreprocessor",
    "CountdownProcessor",
    "Filter",
    "FunctionFilter",
    "FunctionPreprocessor",
    "GSM8KProcessor",
    "MessagesProcessor",
    "Preprocessor",
    "QueryResponseProcessor",
    "RowFieldError",
    "SelfCognitionProcessor",
    "ShareGPTProcessor",
    "UnknownRowShapeError",
    "build_filter",
    "build_preprocessor",
    "require",
    "row_shape",
]
