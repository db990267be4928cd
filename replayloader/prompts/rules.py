"""Priority rules: what one group of G completions says about a prompt, written once per rule.

A rule turns each group's rewards into one number, the group's *signal* (`PriorityRule.signals`); the sampler
keeps, per prompt, the running sum of its groups' signals and how many groups it has, and its priority is their
mean, shrunk toward a prior (`PromptSampler`). So a rule is one vectorised line of numpy and knows nothing of
priors, staleness, retests or trees, which are the same for every rule.

Why a prompt's priority is a group statistic at all: in GRPO (and DAPO, RLOO) each completion's advantage is its
reward minus its group's mean, so a group whose G rewards are equal contributes exactly zero gradient. The
expected spread of the *next* group's rewards is what a draw buys.

- `Learnability`: the group's unbiased reward variance, k(G−k)/(G(G−1)) for k successes out of G: an unbiased
  estimate of p(1−p) for 0/1 rewards (SPEED-RL's signal-to-noise bound is ≤ 4N·p(1−p)).
- `RewardSpread`: the within-group standard deviation of graded rewards.
- `Uniform`: 1 for every group, so every prompt has the same priority: the baseline.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class PriorityRule(Protocol):
    """What `PromptSampler` needs of a rule.

    ``name`` goes into checkpoints; ``binary`` says the rule reads 0/1 rewards (the sampler refuses others);
    ``default_prior`` is the priority of a prompt never measured when the sampler is given no ``prior``.
    `signals` maps rewards of shape (groups, G), G ≥ 2, finite (and 0/1 when ``binary``), to one finite value
    ≥ 0 per group.

    Optional: ``max_signal(group_size)``, the largest signal one group can give (``group_size`` None: any G ≥ 2).
    A checkpoint whose summed signals exceed it times the groups recorded is refused as damaged; a rule without
    it (or returning inf) is not checked.
    """

    name: str
    binary: bool
    default_prior: float

    def signals(self, rewards: np.ndarray) -> np.ndarray: ...


class Learnability:
    """p(1−p) learnability of a prompt with pass rate p, from 0/1 rewards.

    Each group's signal is its unbiased sample variance k(G−k)/(G(G−1)) (k successes out of G), not the plug-in
    p̂(1−p̂) = k(G−k)/G². Why: the quantity to track is the expected within-group variance of the prompt's next
    group, whose expectation is exactly p(1−p) for any G ≥ 2; the plug-in value is low by (G−1)/G, so it would
    rank prompts measured with different group sizes unfairly, and averaging unbiased per-group values keeps
    the prompt's mean unbiased. The same holds one level up: a bucket's prior is the mean of its groups' unbiased
    variances, never p̄(1−p̄) of the bucket's mean pass rate, which over-weights a bucket split between solved and
    unsolved prompts (both halves give zero-variance groups, yet p̄(1−p̄) is large).

    ``default_prior`` is 1/6, the mean of p(1−p) over a pass rate uniform on [0, 1]: a prompt nothing is known
    about is as learnable as an average one, neither favoured nor starved.

    Example:
        >>> Learnability().signals(np.array([[1, 0, 1, 0], [1, 1, 1, 1]]))
        array([0.33333333, 0.        ])
    """

    name = "learnability"
    binary = True
    default_prior = 1.0 / 6.0

    def max_signal(self, group_size: int | None) -> float:
        """k(G−k)/(G(G−1)) is largest at k = G/2: G/(4(G−1)) for even G, (G+1)/(4G) for odd G; 1/2 at G = 2."""
        if group_size is None:
            return 0.5
        return (group_size // 2) * (group_size - group_size // 2) / (group_size * (group_size - 1.0))

    def signals(self, rewards: np.ndarray) -> np.ndarray:
        g = rewards.shape[1]
        k = rewards.sum(axis=1)
        return k * (g - k) / (g * (g - 1.0))


class RewardSpread:
    """The within-group standard deviation of graded rewards (any finite reward, not only 0/1).

    Why the standard deviation and not the variance: GRPO divides each advantage by its group's reward std, so
    the std says whether a group carries signal on the reward's own scale, and a rule on the std is less
    dominated by a few prompts with extreme rewards. Each group's value is ``std(ddof=1)`` (the square root of
    the unbiased variance; for 0/1 rewards, the square root of `Learnability`'s signal).

    ``default_prior`` is sqrt(1/6) ≈ 0.41, `Learnability`'s prior on this scale: right for rewards in [0, 1];
    give the sampler ``prior=`` for rewards on another scale.

    Example:
        >>> RewardSpread().signals(np.array([[0.0, 0.5, 1.0], [0.2, 0.2, 0.2]]))
        array([0.5, 0. ])
    """

    name = "reward_spread"
    binary = False
    default_prior = float(np.sqrt(1.0 / 6.0))

    def max_signal(self, group_size: int | None) -> float:
        """Unbounded: a graded reward's range is not known (nor recorded), so neither is its spread."""
        return float("inf")

    def signals(self, rewards: np.ndarray) -> np.ndarray:
        # shifted by each group's first reward (the std does not change): a group of equal rewards gives exactly 0,
        # where np.std of e.g. [0.2, 0.2, 0.2] gives 3e-17 and the group would never count as without signal
        return (rewards - rewards[:, :1]).std(axis=1, ddof=1)


class Uniform:
    """Every group's signal is 1, so every prompt has priority 1: uniform draws (the baseline the others are
    measured against). Retirement still applies; no prompt is ever judged solved or unsolved (every group has
    signal 1), so there are no retests, and exploration changes nothing.

    Example:
        >>> Uniform().signals(np.zeros((2, 4)))
        array([1., 1.])
    """

    name = "uniform"
    binary = False
    default_prior = 1.0

    def max_signal(self, group_size: int | None) -> float:
        return 1.0

    def signals(self, rewards: np.ndarray) -> np.ndarray:
        return np.ones(rewards.shape[0])
