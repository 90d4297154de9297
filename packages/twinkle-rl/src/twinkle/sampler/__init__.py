"""Samplers (Torch, vLLM): prompts in, SampleResponses out."""
