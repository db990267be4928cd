"""`PromptSampler`'s former draw and feedback, place by place, as plain numpy and Python: the form a GRPO study ran
with, before the compiled kernels (replayloader/kernels/prompts.py). test_kernels.py drives both with the same
calls and requires the same draws and the same state, bit for bit.

Its trees are `SumTree`'s semantics written out: a 1-indexed heap over a power of two of leaves, every ancestor
of a written leaf recomputed from its two children (sums, or minima of keys); a draw descends by the walk of
`kernels.tree.descend`. Each staleness halving is found by popping a min tree of "next decay steps", and every
batch's leaves are rewritten at its draw, as the former sampler did. Only valid calls are modelled (the input
checks are the sampler's own and unchanged).
"""
from __future__ import annotations

import numpy as np

from replayloader.kernels.rng import seed_state, uniforms

MAX_HALVINGS = 30
BELOW_ONE = float(np.nextafter(1.0, 0.0))


class Tree:
    """A sum tree (and, with ``keys``, a min tree of keys) over ``capacity`` slots."""

    def __init__(self, capacity: int, keys: bool = False) -> None:
        self.leaves = 1 << max(0, int(max(1, capacity) - 1).bit_length())
        self.sums = np.zeros(2 * self.leaves)
        self.keys = np.full(2 * self.leaves, np.inf) if keys else None

    @property
    def total(self) -> float:
        return float(self.sums[1])

    def set(self, slot: int, value: float, key: float = np.inf) -> None:
        i = self.leaves + int(slot)
        self.sums[i] = value
        if self.keys is not None:
            self.keys[i] = key
        i >>= 1
        while i >= 1:
            self.sums[i] = self.sums[2 * i] + self.sums[2 * i + 1]
            if self.keys is not None:
                self.keys[i] = min(self.keys[2 * i], self.keys[2 * i + 1])
            i >>= 1

    def descend(self, fraction: float) -> int:
        at, u = 1, fraction * self.total
        while at < self.leaves:
            left = 2 * at
            mass_left = self.sums[left]
            go_right = (u >= mass_left or mass_left <= 0.0) and self.sums[left + 1] > 0.0
            u -= mass_left * go_right
            at = left + go_right
        return at - self.leaves

    def argmin(self) -> int:
        i = 1
        while i < self.leaves:
            i = 2 * i if self.keys[2 * i] <= self.keys[2 * i + 1] else 2 * i + 1
        return i - self.leaves


class FormerSampler:
    """The former `PromptSampler` (same options, valid calls only), for comparison."""

    def __init__(self, n, batch_size, *, signals, prior, labels=None, prior_strength=1.0, prior_memory=0.9,
                 exploration=0.05, retest_every=None, retest_size=1, stale_after=None, retire_after=None,
                 solved_reward=1.0, seed=0):
        self.n, self.batch_size, self.signals, self.prior = n, batch_size, signals, prior
        self.m, self.memory, self.eps = prior_strength, prior_memory, exploration
        self.retest_every, self.retest_size, self.stale_after = retest_every, retest_size, stale_after
        self.retire_after, self.solved_reward = retire_after, solved_reward
        self.learn_prior = labels is not None
        values, self.bucket_of = np.unique(np.zeros(n, np.int64) if labels is None else labels, return_inverse=True)
        self.members = [np.flatnonzero(self.bucket_of == b) for b in range(len(values))]
        self.position = np.empty(n, np.int64)
        for members in self.members:
            self.position[members] = np.arange(len(members))
        self.rng = seed_state(seed)
        self.groups, self.attempts, self.successes, self.signal_sum = (np.zeros(n) for _ in range(4))
        self.measured_at, self.last_tested, self.last_drawn = (np.full(n, -1, np.int64) for _ in range(3))
        self.streak, self.retired = np.zeros(n, np.int64), np.zeros(n, bool)
        self.bucket_sum, self.bucket_weight = np.zeros(len(values)), np.zeros(len(values))
        self.clock = self.step = 0
        self.counters = {"drawn": 0, "retests": 0, "exploration_draws": 0, "feedback_calls": 0, "groups": 0,
                         "zero_variance_groups": 0, "retired": 0}
        self.data, self.active = Tree(n), Tree(n, keys=True)
        self.prior_trees = [Tree(len(m)) for m in self.members]
        self.due = Tree(n, keys=True) if stale_after is not None else None
        for i in range(n):
            self.refresh(i)

    def decay(self, i: int) -> float:
        if self.stale_after is None:
            return 1.0
        halvings = max(self.clock - self.measured_at[i], 0) // self.stale_after
        return 2.0 ** -halvings if halvings < MAX_HALVINGS else 0.0

    def refresh(self, i: int) -> None:
        d = self.decay(i)
        g, s = d * self.groups[i], d * self.signal_sum[i]
        live = not self.retired[i]
        a = s / (g + self.m) if live else 0.0
        c = self.m / (g + self.m) if live else 0.0
        key = float(self.last_tested[i]) if live and g > 0 and s == 0 else np.inf
        self.data.set(i, a)
        self.prior_trees[self.bucket_of[i]].set(self.position[i], c)
        self.active.set(i, float(live), key)
        if self.due is not None:
            due = np.inf
            if live and self.measured_at[i] >= 0:
                halvings = max(self.clock - self.measured_at[i], 0) // self.stale_after
                if halvings < MAX_HALVINGS:
                    due = float(self.measured_at[i] + self.stale_after * (halvings + 1))
            self.due.set(i, 0.0, due)

    def hide(self, i: int) -> None:
        self.data.set(i, 0.0)
        self.prior_trees[self.bucket_of[i]].set(self.position[i], 0.0)
        self.active.set(i, 0.0, np.inf)

    def prior_values(self) -> np.ndarray:
        if not self.learn_prior:
            return np.full(1, self.prior)
        known = self.bucket_weight > 0
        return np.where(known, self.bucket_sum / np.where(known, self.bucket_weight, 1.0), self.prior)

    def priorities(self) -> np.ndarray:
        c = np.array([self.prior_trees[self.bucket_of[i]].sums[self.prior_trees[self.bucket_of[i]].leaves
                                                               + self.position[i]] for i in range(self.n)])
        return self.data.sums[self.data.leaves:self.data.leaves + self.n] + c * self.prior_values()[self.bucket_of]

    def sample(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        chosen = []
        if self.retest_every is not None and self.step % self.retest_every == 0:
            while len(chosen) < min(self.retest_size, k) and self.active.keys[1] < np.inf:
                chosen.append(self.active.argmin())
                self.hide(chosen[-1])
        retests = len(chosen)
        u = uniforms(self.rng, 2 * (k - retests))
        priors = self.prior_values()
        for j in range(k - retests):
            chosen.append(self.draw_one(u[2 * j], u[2 * j + 1], priors))
            self.hide(chosen[-1])
        indices = np.array(chosen, np.int64)
        self.last_tested[indices[:retests]] = self.clock
        self.last_drawn[indices] = self.step
        for i in indices:
            self.refresh(i)
        self.step += 1
        self.counters["drawn"] += k
        self.counters["retests"] += retests
        return indices, np.arange(k) < retests

    def draw_one(self, u_mix: float, u_pick: float, priors: np.ndarray) -> int:
        masses = [self.data.total] + [float(p) * tree.total for p, tree in zip(priors, self.prior_trees)]
        total = sum(masses)
        if u_mix < self.eps or not total > 0:
            self.counters["exploration_draws"] += 1
            return self.active.descend(u_pick)
        target = u_pick * total
        last = max(j for j, mass in enumerate(masses) if mass > 0)
        part = 0
        while part < last and (masses[part] <= 0 or target >= masses[part]):
            target -= masses[part]
            part += 1
        fraction = min(max(target / masses[part], 0.0), BELOW_ONE)
        if part == 0:
            return self.data.descend(fraction)
        return int(self.members[part - 1][self.prior_trees[part - 1].descend(fraction)])

    def feedback(self, idx: np.ndarray, values: np.ndarray, policy_step: int | None = None) -> None:
        signals = np.asarray(self.signals(values), np.float64)
        self.clock = self.clock + 1 if policy_step is None else policy_step
        for i, row, total, x in zip(idx, values, values.sum(axis=1), signals):
            d = self.decay(i)
            self.groups[i] = self.groups[i] * d + 1.0
            self.attempts[i] = self.attempts[i] * d + float(values.shape[1])
            self.successes[i] = self.successes[i] * d + total
            self.signal_sum[i] = self.signal_sum[i] * d + x
            self.measured_at[i] = self.last_tested[i] = self.clock
            self.streak[i] = self.streak[i] + 1 if (row >= self.solved_reward).all() else 0
            if self.retire_after is not None and self.streak[i] >= self.retire_after and not self.retired[i]:
                self.retired[i] = True
                self.counters["retired"] += 1
        if self.learn_prior:
            buckets = self.bucket_of[idx]
            for b in np.unique(buckets):
                self.bucket_sum[b] *= self.memory
                self.bucket_weight[b] *= self.memory
            for b, x in zip(buckets, signals):
                self.bucket_sum[b] += x
                self.bucket_weight[b] += 1.0
        zero = int((values == values[:, :1]).all(axis=1).sum())
        self.counters["feedback_calls"] += 1
        self.counters["groups"] += len(idx)
        self.counters["zero_variance_groups"] += zero
        due = []
        while self.due is not None and self.due.keys[1] <= self.clock:
            due.append(self.due.argmin())
            self.due.set(due[-1], 0.0, np.inf)
        for i in [*np.setdiff1d(np.array(due, np.int64), idx), *np.unique(idx)]:
            self.refresh(i)
