"""Preference losses without a reference model: SimPO, CPO and ORPO, on the pair layout of
``twinkle.loss.pairs``, each normalised by pairs and reporting ``preference_stats``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from twinkle.loss.base import Loss, LossInputs
from twinkle.loss.pairs import preference_stats, read_pairs
from twinkle.loss.registry import LOSSES


def _positive(owner: str, name: str, value: float) -> float:
    if not 0 < value < float("inf"):
        raise ValueError(f"{owner}: {name} must be a positive finite number, got {value}")
    return value


def _non_negative(owner: str, name: str, value: float) -> float:
    if not 0 <= value < float("inf"):
        raise ValueError(f"{owner}: {name} must be a finite number >= 0, got {value}")
    return value


@LOSSES.register
class SimPOLoss(Loss):
    """SimPO: the length-normalised log-likelihood is the implicit reward, with a target
    margin. With ``m = mean logp over the row's label tokens``, per pair::

        l = -log sigmoid(beta * (m_c - m_r) - gamma)

    No reference model. The implicit rewards in ``preference_stats`` are ``beta * m``.
    """

    reads = LossInputs()

    def __init__(self, beta: float = 2.0, gamma: float = 0.5) -> None:
        self.beta = _positive("SimPOLoss", "beta", beta)
        self.gamma = _non_negative("SimPOLoss", "gamma", gamma)

    def __call__(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, Any], **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        pairs = read_pairs(type(self).__name__, inputs, outputs)
        chosen, rejected = pairs.chosen_rejected(self.beta * pairs.sums / pairs.lengths)
        per_pair = -F.logsigmoid(chosen - rejected - self.gamma)
        stats = preference_stats(chosen, rejected)
        return {"loss": per_pair.sum(), "num_tokens": pairs.num_pairs, "preference_stats": stats}


@LOSSES.register
class CPOLoss(Loss):
    """Contrastive Preference Optimisation: DPO's sigmoid loss without a reference, plus a
    behaviour-cloning term on the chosen response. With ``pi`` the summed label-token logps
    and ``|y_c|`` the chosen row's label tokens, per pair::

        l = -log sigmoid(beta * (pi_c - pi_r)) - alpha * pi_c / |y_c|

    ``alpha = 0`` drops the cloning term. The implicit rewards are ``beta * pi``.
    """

    reads = LossInputs()

    def __init__(self, beta: float = 0.1, alpha: float = 1.0) -> None:
        self.beta = _positive("CPOLoss", "beta", beta)
        self.alpha = _non_negative("CPOLoss", "alpha", alpha)

    def __call__(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, Any], **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        pairs = read_pairs(type(self).__name__, inputs, outputs)
        chosen, rejected = pairs.chosen_rejected(pairs.sums)
        chosen_length, _ = pairs.chosen_rejected(pairs.lengths)
        per_pair = -F.logsigmoid(self.beta * (chosen - rejected))
        per_pair = per_pair - self.alpha * chosen / chosen_length
        stats = preference_stats(self.beta * chosen, self.beta * rejected)
        return {"loss": per_pair.sum(), "num_tokens": pairs.num_pairs, "preference_stats": stats}


@LOSSES.register
class ORPOLoss(Loss):
    """Odds-Ratio Preference Optimisation: supervised loss on the chosen response plus a
    log odds-ratio penalty, no reference. With ``m = mean logp over the row's label tokens``
    and ``odds(m) = log(exp(m) / (1 - exp(m)))``, per pair::

        l = -m_c - beta * log sigmoid(odds(m_c) - odds(m_r))

    The implicit rewards are ``beta * m``. ``beta`` is ORPO's lambda.
    """

    reads = LossInputs()

    def __init__(self, beta: float = 0.1) -> None:
        self.beta = _positive("ORPOLoss", "beta", beta)

    def __call__(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, Any], **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        pairs = read_pairs(type(self).__name__, inputs, outputs)
        chosen, rejected = pairs.chosen_rejected(pairs.sums / pairs.lengths)
        # log(1 - exp(m)) with m < 0; the clamp keeps an (impossible) m = 0 finite.
        log_odds = (chosen - rejected) - (
            torch.log(-torch.expm1(chosen.clamp(max=-1e-7)))
            - torch.log(-torch.expm1(rejected.clamp(max=-1e-7)))
        )
        per_pair = -chosen - self.beta * F.logsigmoid(log_odds)
        stats = preference_stats(self.beta * chosen, self.beta * rejected)
        return {"loss": per_pair.sum(), "num_tokens": pairs.num_pairs, "preference_stats": stats}
