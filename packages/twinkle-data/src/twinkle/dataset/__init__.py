"""Datasets built on Hugging Face `datasets`: loading, mapping, encoding, mixing and packing."""
