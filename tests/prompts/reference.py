"""A plain-numpy model of `PromptSampler`'s records and priorities: loops and the formulas of the module doc, no
trees, no vectorised bookkeeping. The property tests drive both with the same feedback and compare."""
from __future__ import annotations

import numpy as np

MAX_HALVINGS = 30


def learnability(rewards: np.ndarray) -> np.ndarray:
    """k(G-k)/(G(G-1)), one group at a time."""
    out = []
    for row in rewards:
        g, k = len(row), row.sum()
        out.append(k * (g - k) / (g * (g - 1)))
    return np.array(out)


class Reference:
    def __init__(self, n, *, labels=None, prior=1 / 6, prior_strength=1.0, prior_memory=0.9, exploration=0.0,
                 stale_after=None, retire_after=None, solved_reward=1.0, signals=learnability):
        self.n, self.prior, self.m, self.beta = n, prior, prior_strength, prior_memory
        self.eps, self.stale_after, self.retire_after = exploration, stale_after, retire_after
        self.solved_reward, self.signals = solved_reward, signals
        self.labels = None if labels is None else np.asarray(labels)
        self.buckets = {} if labels is None else {int(b): [0.0, 0.0] for b in np.unique(labels)}
        self.groups, self.attempts, self.successes, self.signal_sum = (np.zeros(n) for _ in range(4))
        self.measured_at = np.full(n, -1)
        self.streak = np.zeros(n, int)
        self.retired = np.zeros(n, bool)
        self.clock = 0

    def decay(self, i: int) -> float:
        if self.stale_after is None or self.measured_at[i] < 0:
            return 1.0
        halvings = (self.clock - self.measured_at[i]) // self.stale_after
        return 0.5 ** halvings if halvings < MAX_HALVINGS else 0.0

    def feedback(self, indices, rewards, policy_step=None):
        self.clock = self.clock + 1 if policy_step is None else policy_step
        signals = self.signals(rewards)
        for i, row, x in zip(indices, rewards, signals):
            d = self.decay(i)
            self.groups[i] = self.groups[i] * d + 1
            self.attempts[i] = self.attempts[i] * d + len(row)
            self.successes[i] = self.successes[i] * d + row.sum()
            self.signal_sum[i] = self.signal_sum[i] * d + x
            self.measured_at[i] = self.clock
            self.streak[i] = self.streak[i] + 1 if (row >= self.solved_reward).all() else 0
            if self.retire_after is not None and self.streak[i] >= self.retire_after:
                self.retired[i] = True
        if self.labels is not None:
            for b in np.unique(self.labels[indices]):
                mine = self.labels[indices] == b
                s, w = self.buckets[int(b)]
                self.buckets[int(b)] = [s * self.beta + signals[mine].sum(), w * self.beta + mine.sum()]

    def prior_of(self, i: int) -> float:
        if self.labels is None:
            return self.prior
        s, w = self.buckets[int(self.labels[i])]
        return s / w if w > 0 else self.prior

    def priorities(self) -> np.ndarray:
        out = np.zeros(self.n)
        for i in range(self.n):
            if not self.retired[i]:
                d = self.decay(i)
                out[i] = (d * self.signal_sum[i] + self.m * self.prior_of(i)) / (d * self.groups[i] + self.m)
        return out

    def probabilities(self) -> np.ndarray:
        p, live = self.priorities(), ~self.retired
        uniform = live / live.sum()
        return (1 - self.eps) * p / p.sum() + self.eps * uniform if p.sum() > 0 else uniform

    def judged(self) -> np.ndarray:
        """Measured (weight left), every group without signal, not retired."""
        d = np.array([self.decay(i) for i in range(self.n)])
        return ~self.retired & (d * self.groups > 0) & (d * self.signal_sum == 0)
