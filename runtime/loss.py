"""RL objectives over token log-probs (torch), as in PipelineRL and PPO.

``grpo`` is PipelineRL's simplified GRPO: REINFORCE with a detached importance weight
``w = clamp(exp(logp − logp_old), 0, 1 + ε)`` (``logp_old``: the server's sampling
log-probs), advantage ``A = reward − group mean``, every token weighted
``1 / num_sequences`` of the optimizer step, no KL and no entropy bonus by default.
``ppo`` is PPO-clip with the same token weighting. An optional reference-model KL
(the k3 estimator ``exp(r) − r − 1`` with ``r = logp_ref − logp``) is added with
``kl_coef``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class LossOutput:
    loss: torch.Tensor  # scalar to backpropagate (this micro-batch's share of the step)
    weights: torch.Tensor  # unclamped importance ratios of the tokens (detached)
    kl: float


def group_advantages(rewards: list[float], group_ids: list[int]) -> list[float]:
    """reward − mean reward of its group (over the samples given)."""
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    for r, g in zip(rewards, group_ids):
        sums[g] = sums.get(g, 0.0) + r
        counts[g] = counts.get(g, 0) + 1
    return [r - sums[g] / counts[g] for r, g in zip(rewards, group_ids)]


def effective_sample_size(weights: torch.Tensor) -> float:
    """ESS = (Σw)² / (N Σw²), in (0, 1]; 1 when all weights are equal."""
    w = weights.double()
    return ess_from_sums(w.numel(), float(w.sum()), float((w * w).sum()))


def ess_from_sums(num_weights: int, weight_sum: float, weight_sq_sum: float) -> float:
    """The ESS of weights given only N, Σw and Σw² (summed over a sharded trainer's ranks)."""
    if num_weights == 0:
        return 1.0
    return weight_sum**2 / (num_weights * weight_sq_sum)


def clipped_mask(weights: torch.Tensor, algorithm: str, epsilon: float) -> torch.Tensor:
    """The tokens whose importance weight the objective clipped: above ``1 + ε``
    (``grpo`` clamps only from above), outside ``[1 − ε, 1 + ε]`` (``ppo``)."""
    clipped = weights > 1.0 + epsilon
    if algorithm == "ppo":
        clipped |= weights < 1.0 - epsilon
    return clipped


def clip_fraction(weights: torch.Tensor, algorithm: str, epsilon: float) -> float | None:
    """Share of tokens whose importance weight the objective clipped (:func:`clipped_mask`)."""
    if weights.numel() == 0:
        return None
    return float(clipped_mask(weights, algorithm, epsilon).double().mean())


def rl_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    num_sequences: int,
    algorithm: str = "grpo",
    epsilon: float = 0.2,
    logp_ref: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> LossOutput:
    """Tensors are [batch, tokens]; ``advantages`` is [batch]; ``mask`` marks real tokens."""
    if num_sequences < 1:
        raise ValueError(f"num_sequences must be >= 1, not {num_sequences}")
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - logp_old)
    adv = advantages.to(logp.dtype)[:, None]
    if algorithm == "grpo":
        per_token = -ratio.clamp(0.0, 1.0 + epsilon).detach() * adv * logp
    elif algorithm == "ppo":
        clipped = ratio.clamp(1.0 - epsilon, 1.0 + epsilon)
        per_token = -torch.minimum(ratio * adv, clipped * adv)
    else:
        raise ValueError(f"algorithm must be 'grpo' or 'ppo', not {algorithm!r}")
    kl = 0.0
    if logp_ref is not None and kl_coef > 0:
        r = logp_ref - logp
        kl_tok = torch.exp(r) - r - 1.0
        per_token = per_token + kl_coef * kl_tok
        kl = float((kl_tok.detach() * mask).sum() / mask.sum().clamp(min=1))
    loss = (per_token * mask).sum() / num_sequences
    return LossOutput(loss, ratio.detach()[mask.bool()], kl)
