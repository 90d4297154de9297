"""Patches applied to Hugging Face models (padding-free attention, linear attention, ...)."""
