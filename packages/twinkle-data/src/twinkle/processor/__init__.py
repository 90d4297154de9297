"""InputProcessor: pads or packs lists of InputFeatures into model tensors, and unpacks outputs."""

from twinkle.processor.input_processor import INPUT_PROCESSORS, PADDING_SIDES, InputProcessor
from twinkle.processor.packed_rows import PackedRows, pack_padded
from twinkle.processor.sequences import IGNORE_INDEX

__all__ = [
    "IGNORE_INDEX",
    "INPUT_PROCESSORS",
    "PADDING_SIDES",
    "InputProcessor",
    "PackedRows",
    "pack_padded",
]
