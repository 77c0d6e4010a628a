"""The GRPO / PPO objectives of the trainer, on hand-made tensors."""

import pytest
import torch

from runtime.loss import effective_sample_size, group_advantages, rl_loss


def test_group_advantages_subtract_the_group_mean():
    adv = group_advantages([1.0, 0.0, 0.5, 0.5], [7, 7, 8, 8])
    assert adv == [0.5, -0.5, 0.0, 0.0]


def test_grpo_on_policy_is_reinforce_weighted_by_one_over_num_sequences():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    out = rl_loss(logp, logp.detach(), adv, mask, num_sequences=4)
    expected = -(1.0 * (-1.0 - 2.0) + (-2.0) * (-0.5)) / 4
    assert out.loss.item() == pytest.approx(expected)
    out.loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-0.25, -0.25], [0.5, 0.0]]))


def test_grpo_importance_weight_is_clamped_and_detached():
    logp = torch.tensor([[0.0]], requires_grad=True)
    old = torch.tensor([[-2.0]])  # ratio e^2 > 1 + eps
    out = rl_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 1), 1, "grpo", epsilon=0.5)
    out.loss.backward()
    assert logp.grad.item() == pytest.approx(-1.5)  # -(1 + eps) * A
    assert out.weights.item() == pytest.approx(torch.e**2)


def test_ppo_clip_stops_the_gradient_outside_the_trust_region():
    logp = torch.tensor([[0.0]], requires_grad=True)
    out = rl_loss(
        logp, torch.tensor([[-1.0]]), torch.tensor([1.0]), torch.ones(1, 1), 1, "ppo", 0.2
    )
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-1.2) and logp.grad.item() == 0.0


def test_kl_to_reference_is_zero_at_the_reference_and_positive_elsewhere():
    logp = torch.tensor([[-1.0, -1.0]])
    same = rl_loss(logp, logp, torch.zeros(1), torch.ones(1, 2), 1, logp_ref=logp, kl_coef=0.1)
    other = rl_loss(logp, logp, torch.zeros(1), torch.ones(1, 2), 1, logp_ref=logp - 1, kl_coef=0.1)
    assert same.kl == 0.0 and other.kl > 0 and other.loss.item() > 0


def test_ess_is_one_for_equal_weights_and_lower_otherwise():
    assert effective_sample_size(torch.ones(5)) == pytest.approx(1.0)
    assert effective_sample_size(torch.tensor([1.0, 0.0, 0.0, 0.0])) == pytest.approx(0.25)


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="algorithm"):
        rl_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1), 1, "a2c")
    with pytest.raises(ValueError, match="num_sequences"):
        rl_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1), 0)
