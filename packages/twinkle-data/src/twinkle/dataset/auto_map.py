"""What ``encode()`` does with rows no ``map`` converted: log which shapes it found, warn
about self-cognition placeholders left unfilled, and hand them to ``AutoPreprocessor``."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from twinkle.preprocessor import ROW_SHAPES, row_shape
from twinkle.utils import get_logger

logger = get_logger("twinkle.dataset")

SAMPLE_ROWS = 100
"""How many leading rows the log describes."""

PLACEHOLDERS = ("{{NAME}}", "{{AUTHOR}}")


def announce_auto_preprocessing(name: str, sample: Iterable[Mapping[str, Any]]) -> None:
    """Log once, before the pass, the shapes of the first rows of dataset ``name``, and
    warn when they hold the self-cognition placeholders (trained as written unless filled)."""
    rows = list(sample)
    shapes = Counter(row_shape(row) for row in rows)
    found = ", ".join(
        f"{count} {shape or 'of no known shape'}" for shape, count in shapes.most_common()
    )
    logger.info(
        "encode(): dataset %r was not map()ped, so AutoPreprocessor converts its raw rows by "
        "their shape (%s); of the first %d rows: %s. Call map(...) before encode() to convert "
        "them your own way",
        name,
        ", ".join(ROW_SHAPES),
        len(rows),
        found or "none",
    )
    texts = [json.dumps(row, ensure_ascii=False, default=str) for row in rows]
    if any(placeholder in text for text in texts for placeholder in PLACEHOLDERS):
        logger.warning(
            "dataset %r holds the self-cognition placeholders %s, which are trained as "
            "written; to fill them call map('SelfCognitionProcessor', init_args={'model_name': "
            "..., 'model_author': ...}) before encode()",
            name,
            "/".join(PLACEHOLDERS),
        )
