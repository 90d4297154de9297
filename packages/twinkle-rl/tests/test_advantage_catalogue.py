"""GAE, the reverse-KL advantage, reward components, one generation per prompt, RLOO's
scales and DAPO's filters, against values computed by hand or by a direct sum."""

import pytest
import torch

from twinkle.advantage import (
    GAEAdvantage,
    GRPOAdvantage,
    ReverseKLAdvantage,
    RLOOAdvantage,
    dynamic_sampling,
    overlong_filter,
    soft_overlong_penalty,
)


def gae_by_direct_sum(rewards, values, gamma, lam):
    """A_t = sum_l (gamma lam)^l delta_{t+l} over one unmasked row, written as the sum."""
    n = len(rewards)
    deltas = [
        rewards[t] + gamma * (values[t + 1] if t + 1 < n else 0.0) - values[t] for t in range(n)
    ]
    return [sum((gamma * lam) ** k * deltas[t + k] for k in range(n - t)) for t in range(n)]


def test_gae_by_hand_on_three_tokens():
    # gamma = 1, lambda = 1: A_t = (sum of the rewards from t on) - V_t.
    adv, ret = GAEAdvantage(1.0, 1.0, normalize=False)([[0.0, 0.0, 1.0]], [[0.5, 0.25, 0.75]])
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.75, 0.25]]))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 1.0]]))
    # lambda = 0: one-step TD errors.
    adv, _ = GAEAdvantage(0.9, 0.0, normalize=False)([[1.0, 2.0]], [[0.5, 1.0]])
    torch.testing.assert_close(adv, torch.tensor([[1.0 + 0.9 - 0.5, 2.0 - 1.0]]))


def test_gae_with_a_mask_skips_the_masked_positions():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(2, 6, generator=gen, dtype=torch.float64)
    values = torch.randn(2, 6, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 0, 1, 1]], dtype=torch.bool)
    adv, ret = GAEAdvantage(0.95, 0.9, normalize=False)(rewards, values, masks=mask)
    for b in range(2):
        where = mask[b].nonzero().flatten().tolist()
        expected = gae_by_direct_sum(
            rewards[b, where].tolist(), values[b, where].tolist(), 0.95, 0.9
        )
        torch.testing.assert_close(adv[b, where], torch.tensor(expected, dtype=torch.float32))
        torch.testing.assert_close(ret[b, where], adv[b, where] + values[b, where].float())
    assert adv[~mask].abs().sum() == 0 and ret[~mask].abs().sum() == 0
    whitened, _ = GAEAdvantage(0.95, 0.9)(rewards, values, masks=mask)
    assert whitened[mask].mean().item() == pytest.approx(0.0, abs=1e-6)
    assert whitened[mask].std(unbiased=False).item() == pytest.approx(1.0, abs=1e-5)


def test_gae_ragged_lists_and_token_rewards():
    token_rewards = GAEAdvantage.build_token_rewards([1.0, 0.0], [3, 1])
    assert token_rewards == [[0.0, 0.0, 1.0], [0.0]]
    adv, _ = GAEAdvantage(1.0, 1.0, normalize=False)(token_rewards, [[0.0, 0.0, 0.0], [0.5]])
    torch.testing.assert_close(adv, torch.tensor([[1.0, 1.0, 1.0], [-0.5, 0.0, 0.0]]))
    shaped = GAEAdvantage.build_token_rewards(
        [1.0], [2], old_logps=[[-1.0, -2.0]], ref_logps=[[-1.5, -1.0]], kl_coef=0.1
    )
    assert shaped == [[pytest.approx(-0.05), pytest.approx(1.1)]]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: GAEAdvantage(gamma=1.5), "gamma must lie in"),
        (lambda: GAEAdvantage(gae_lambda=-0.1), "gae_lambda must lie in"),
        (lambda: GAEAdvantage()([[1.0, float("nan")]], [[0.0, 0.0]]), r"rewards\[0\]\[1\] is nan"),
        (lambda: GAEAdvantage()([[1.0, 0.0]], [[0.0]]), "must have one shape"),
        (lambda: GAEAdvantage()([[1.0]], [[0.0]], masks=[[1, 1]]), "masks has shape"),
        (lambda: GAEAdvantage.build_token_rewards([1.0], [0]), "needs at least one"),
    ],
)
def test_gae_bad_inputs(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_reverse_kl_advantage():
    student = [[-1.0, -2.0], [-0.5]]
    teacher = [[-1.5, -1.0], [-0.5]]
    got = ReverseKLAdvantage(kl_coef=2.0, center=False)(student, teacher)
    torch.testing.assert_close(got, torch.tensor([[-1.0, 2.0], [0.0, 0.0]]))
    # Centred (the default): minus the mean over the three completion tokens, 1/3.
    centred = ReverseKLAdvantage(kl_coef=2.0)(student, teacher)
    third = 1.0 / 3.0
    torch.testing.assert_close(centred, torch.tensor([[-1.0 - third, 2.0 - third], [-third, 0.0]]))
    with pytest.raises(TypeError, match="center must be True or False"):
        ReverseKLAdvantage(center="yes")
    with pytest.raises(ValueError, match=r"teacher_logps\[0\]\[0\] is inf"):
        ReverseKLAdvantage()([[-1.0]], [[float("inf")]])


def test_reward_components_are_summed():
    components = [[1.0, 0.5], [0.0, 0.0], [2.0, 1.0], [1.0, 1.0]]
    summed = [1.5, 0.0, 3.0, 2.0]
    for estimator in (GRPOAdvantage(), RLOOAdvantage()):
        torch.testing.assert_close(
            estimator(components, num_generations=2, scale="batch"),
            estimator(summed, num_generations=2, scale="batch"),
        )
        torch.testing.assert_close(
            estimator(torch.tensor(components), num_generations=2, scale="none"),
            estimator(summed, num_generations=2, scale="none"),
        )


def test_one_generation_per_prompt_uses_the_batch_baseline():
    rewards = [1.0, 3.0, 2.0, 6.0]
    centred = torch.tensor([-2.0, 0.0, -1.0, 3.0])
    torch.testing.assert_close(GRPOAdvantage()(rewards, num_generations=1, scale="none"), centred)
    batch = GRPOAdvantage()(rewards, num_generations=1, scale="batch")
    torch.testing.assert_close(batch, centred / torch.tensor(rewards).std(), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="use scale='batch' or 'none'"):
        GRPOAdvantage()(rewards, num_generations=1)


def test_rloo_takes_grpos_scales():
    rewards = [1.0, 2.0, 6.0, 0.0, 0.0, 3.0]
    plain = RLOOAdvantage()(rewards, num_generations=3)
    stds = torch.tensor(rewards).view(2, 3).std(dim=1).repeat_interleave(3)
    torch.testing.assert_close(
        RLOOAdvantage()(rewards, num_generations=3, scale="group"), plain / (stds + 1e-6)
    )


def test_dapo_pieces():
    torch.testing.assert_close(
        soft_overlong_penalty([10, 12, 14, 16, 20], max_length=16, cache_length=4),
        torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]),
    )
    assert overlong_filter(["stop", "length", "abort"]).tolist() == [True, False, True]
    keep = dynamic_sampling([1.0, 1.0, 0.0, 1.0, 0.0, 0.0], num_generations=2)
    assert keep.tolist() == [False, False, True, True, False, False]
    with pytest.raises(ValueError, match="cache_length must lie in"):
        soft_overlong_penalty([1], max_length=4, cache_length=8)
    with pytest.raises(ValueError, match="stop_reasons must be among"):
        overlong_filter(["eos"])
    with pytest.raises(ValueError, match="do not split into groups"):
        dynamic_sampling([1.0, 0.0, 1.0], num_generations=2)
