"""Advantage estimators by name: ``ADVANTAGES.get('GRPOAdvantage')``, or a plugin's
``ADVANTAGES.get('ms://org/repo:MyAdvantage')``; register your own with
``@ADVANTAGES.register``."""

from __future__ import annotations

from twinkle.advantage.base import Advantage
from twinkle.advantage.grpo import GRPOAdvantage
from twinkle.advantage.rloo import RLOOAdvantage
from twinkle.utils import Registry

ADVANTAGES: Registry[type[Advantage]] = Registry("advantage", base=Advantage)

ADVANTAGES.register(GRPOAdvantage)
ADVANTAGES.register(RLOOAdvantage)
