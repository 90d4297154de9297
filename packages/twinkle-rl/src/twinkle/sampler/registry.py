"""Samplers by name: ``SAMPLERS.get('vLLMSampler')``, or a plugin's
``SAMPLERS.get('ms://org/repo:MySampler')``; register your own with ``@SAMPLERS.register``.
Every sampler ``twinkle.sampler`` exports is registered."""

from __future__ import annotations

import twinkle.sampler
from twinkle.sampler.base import Sampler
from twinkle.utils import Registry

SAMPLERS: Registry[type[Sampler]] = Registry("sampler", base=Sampler)
SAMPLERS.register_exported(twinkle.sampler)
