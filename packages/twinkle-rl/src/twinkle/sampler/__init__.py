"""Samplers (Torch, vLLM): prompts in, SampleResponses out."""

from twinkle.sampler.base import Sampler
from twinkle.sampler.torch_sampler import TorchSampler
from twinkle.sampler.vllm_sampler import vLLMSampler

__all__ = ["Sampler", "TorchSampler", "vLLMSampler"]
