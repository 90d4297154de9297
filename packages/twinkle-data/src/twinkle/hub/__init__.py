"""Resolve model, tokenizer and dataset ids (`ms://`, `hf://`, local, bundled) to folders."""
