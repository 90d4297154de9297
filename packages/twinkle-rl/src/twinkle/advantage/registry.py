"""Advantage estimators by name: ``ADVANTAGES.get('GRPOAdvantage')``, or a plugin's
``ADVANTAGES.get('ms://org/repo:MyAdvantage')``; register your own with
``@ADVANTAGES.register``. Every estimator ``twinkle.advantage`` exports is registered."""

from __future__ import annotations

import twinkle.advantage
from twinkle.advantage.base import Advantage
from twinkle.utils import Registry

ADVANTAGES: Registry[type[Advantage]] = Registry("advantage", base=Advantage)
ADVANTAGES.register_exported(twinkle.advantage)
