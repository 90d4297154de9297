"""Tinker-compatible ``/api/v1`` routes served on the Twinkle server (see the Tinker SPEC).

``router`` holds them all; app.py mounts it beside the Twinkle routes, on the same state,
keys and training runs.
"""

from fastapi import APIRouter

from twinkle.server.tinker import client, futures_route, training, weights
from twinkle.server.tinker.sampling import sampling_router

router = APIRouter()
for _module in (client, futures_route, training, weights):
    router.include_router(_module.router)
router.include_router(sampling_router)

__all__ = ["router"]
