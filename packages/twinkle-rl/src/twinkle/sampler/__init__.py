"""Samplers (Torch, vLLM): prompts in, SampleResponses out."""

from twinkle.sampler.base import BASE_MODEL, Sampler
from twinkle.sampler.torch_sampler import TorchSampler
from twinkle.sampler.vllm_sampler import vLLMSampler

__all__ = ["BASE_MODEL", "Sampler", "TorchSampler", "vLLMSampler"]
