"""Samplers by name: ``SAMPLERS.get('vLLMSampler')``, or a plugin's
``SAMPLERS.get('ms://org/repo:MySampler')``; register your own with ``@SAMPLERS.register``."""

from __future__ import annotations

from twinkle.sampler.base import Sampler
from twinkle.sampler.torch_sampler import TorchSampler
from twinkle.sampler.vllm_sampler import vLLMSampler
from twinkle.utils import Registry

SAMPLERS: Registry[type[Sampler]] = Registry("sampler", base=Sampler)

SAMPLERS.register(TorchSampler)
SAMPLERS.register(vLLMSampler)
