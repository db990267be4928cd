"""A plain-numpy model of ReplayBuffer's documented behaviour, one obvious loop at a time.

Used by the stateful fuzz test: after every call on the real buffer the model makes the same call and the two
are compared (slots, ids, weights, visits, counters, eviction choice, stored data, strategy memory). It knows
the named strategies of `strategies.by_name`; it cannot predict which slots a sample draws (the buffer's own
RNG), so for a sample it checks that every draw is legal and correctly described instead.
"""
from __future__ import annotations

import numpy as np

FLOOR = 1e-6
INIT = {"none": "mean", "loss_diff": "mean", "grad_norm": "mean", "grad_bound": "mean", "loss": "mean",
        "lsr": "lsr", "linucb": "linucb", "per": "max"}
FEEDBACK_KEY = {"none": None, "loss_diff": "loss", "grad_norm": "grad_norm", "grad_bound": "grad_bound",
                "loss": "loss", "lsr": "loss", "linucb": "loss", "per": "weight"}
LOSS_DIFF = ("loss_diff", "lsr", "linucb")


class ModelError(Exception):
    """What the model expects the real call to raise (the type and a fragment of the message)."""

    def __init__(self, kind: type, fragment: str) -> None:
        super().__init__(fragment)
        self.kind, self.fragment = kind, fragment


class ReferenceBuffer:
    def __init__(self, capacity: int, alpha: float, beta: float | None, strategy: str) -> None:
        self.capacity, self.alpha, self.beta, self.strategy = capacity, alpha, beta, strategy
        self.evict = "fifo" if strategy in ("per", "none") else "lowest"
        self.size = 0
        self.next_serial = 0
        self.serial = np.full(capacity, -1, np.int64)
        self.added_at = np.zeros(capacity, np.int64)
        self.visits = np.zeros(capacity, np.int64)
        self.weights = np.zeros(capacity)
        self.last_loss = np.full(capacity, np.nan)
        self.rows: dict[str, np.ndarray] = {}
        self.features: np.ndarray | None = None
        self.last_add = np.empty(0, np.int64)
        self.fifo_next = 0
        self.max_seen = 1.0
        self.A: np.ndarray | None = None
        self.b: np.ndarray | None = None
        self.counters = dict(add_calls=0, added=0, evicted=0, sample_calls=0, sampled=0, updated=0,
                             stale_feedback=0, first_visits=0, sampled_age_sum=0)

    # ------------------------------------------------------------------ add
    def initial_weights(self, x: np.ndarray) -> np.ndarray:
        """The weights the strategy's initializer gives n new examples with features x."""
        n, init, live = len(x), INIT[self.strategy], slice(0, self.size)
        if init == "mean":
            return np.full(n, self.weights[live].mean() if self.size else 1.0)
        if init == "max":
            return np.full(n, self.max_seen)
        if init == "lsr":
            if not self.size:
                return np.full(n, 1.0)
            theta = np.linalg.lstsq(self.features[live], self.weights[live], rcond=None)[0]
            return np.maximum(x @ theta, FLOOR)
        return self.linucb_scores(x)

    def linucb_scores(self, x: np.ndarray) -> np.ndarray:
        if self.A is None:
            self.A, self.b = np.eye(x.shape[1]), np.zeros(x.shape[1])
        a_inv = np.linalg.inv(self.A)
        width = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", x, a_inv, x), 0.0))
        return np.maximum(x @ (a_inv @ self.b) + width, FLOOR)

    def victims(self, m: int) -> np.ndarray:
        if self.evict == "fifo":
            slots = (self.fifo_next + np.arange(m)) % self.capacity
            self.fifo_next = int((self.fifo_next + m) % self.capacity)
            return slots
        live = np.arange(self.size)
        order = np.lexsort((live, self.weights[live]))  # lowest weight first, ties: lowest slot
        return live[order[:m]]

    def add(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        n = len(next(iter(batch.values())))
        if n > self.capacity:
            raise ModelError(ValueError, f"capacity {self.capacity}")
        x = batch["input_ids"].astype(np.float64).reshape(n, -1)
        weights = self.initial_weights(x)
        free = min(n, self.capacity - self.size)
        slots = np.concatenate([self.size + np.arange(free), self.victims(n - free)]).astype(np.int64)
        if not self.rows:
            self.rows = {k: np.zeros((self.capacity, *v.shape[1:]), v.dtype) for k, v in batch.items()}
        for k, v in batch.items():
            self.rows[k][slots] = v
        if INIT[self.strategy] in ("lsr", "linucb"):
            if self.features is None:
                self.features = np.zeros((self.capacity, x.shape[1]))
            self.features[slots] = x
        serials = self.next_serial + np.arange(n)
        self.serial[slots] = serials
        self.added_at[slots] = self.counters["add_calls"]
        self.visits[slots] = 0
        self.last_loss[slots] = np.nan
        self.weights[slots] = weights
        self.next_serial += n
        self.size += free
        self.last_add = slots
        c = self.counters
        c["add_calls"] += 1
        c["added"] += n
        c["evicted"] += n - free
        return serials * self.capacity + slots

    # ------------------------------------------------------------------ sample
    def probabilities(self) -> np.ndarray:
        live = self.weights[: self.size]
        priority = np.where(live > 0, live ** self.alpha if self.alpha else 1.0, 0.0)
        if priority.sum() == 0:
            return np.full(self.size, 1.0 / self.size)
        return priority / priority.sum()

    def legal_sample(self, k: int) -> None:
        """Raise the ModelError a sample of k must give, if any."""
        if self.size == 0:
            raise ModelError(ValueError, "empty buffer")
        if self.strategy == "none" and k > len(self.last_add):
            raise ModelError(ValueError, "no-replay mode")

    def check_sample(self, sample, k: int) -> None:
        """Assert that the buffer's sample of k is one this model allows, and count it."""
        self.legal_sample(k)
        slots = sample.ids % self.capacity
        assert sample.ids.shape == (k,) and (slots < self.size).all(), (sample.ids, self.size)
        np.testing.assert_array_equal(sample.ids // self.capacity, self.serial[slots])
        ages = self.counters["add_calls"] - 1 - self.added_at[slots]
        np.testing.assert_array_equal(sample.ages, ages)
        if self.strategy == "none":
            np.testing.assert_array_equal(slots, self.last_add[:k])
            np.testing.assert_allclose(sample.probabilities, 1.0 / k)
        else:
            p = self.probabilities()
            assert (p[slots] > 0).all(), "sampled an example of probability 0"
            np.testing.assert_allclose(sample.probabilities, p[slots], rtol=1e-9)
            if self.beta is None:
                assert (sample.weights == 1).all()  # weights are always an array: ones without beta
            else:
                p_min = p[p > 0].min()
                np.testing.assert_allclose(sample.weights, (p_min / p[slots]) ** self.beta, rtol=1e-9)
        for name, rows in self.rows.items():
            np.testing.assert_array_equal(sample.data[name], rows[slots])
        c = self.counters
        c["sample_calls"] += 1
        c["sampled"] += k
        c["sampled_age_sum"] += int(ages.sum())

    # ------------------------------------------------------------------ update
    def update(self, ids: np.ndarray, key: str, values: np.ndarray) -> int:
        """Feedback ``key=values`` for ids; returns how many weights change (or raises ModelError)."""
        expected_key = FEEDBACK_KEY[self.strategy]
        if expected_key is not None and key != expected_key:
            raise ModelError(TypeError, expected_key)
        bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
        if len(bad):
            raise ModelError(ValueError, f"{key}[{bad[0]}]")
        for j, i in enumerate(ids):
            if i < 0 or i >= self.next_serial * self.capacity or self.serial[i % self.capacity] < i // self.capacity:
                raise ModelError(ValueError, f"ids[{j}] = {i} was never issued")
        kept: dict[int, float] = {}
        stale = 0
        for i, v in zip(ids, values):  # last occurrence wins; stale ids are counted, one by one
            slot = int(i % self.capacity)
            if self.serial[slot] != i // self.capacity:
                stale += 1
            else:
                kept.pop(slot, None)
                kept[slot] = float(v)
        counting = expected_key is not None
        changed: dict[int, float] = {}
        first = 0
        for slot, v in kept.items():
            if counting:
                self.visits[slot] += 1
                first += int(self.visits[slot] == 1)
            if expected_key is None:
                continue
            if self.strategy in LOSS_DIFF:
                previous, self.last_loss[slot] = self.last_loss[slot], v
                if np.isnan(previous):
                    continue
                changed[slot] = max(abs(previous - v), FLOOR)
            else:
                changed[slot] = max(v, 0.0 if self.strategy == "per" else FLOOR)
        slots = np.array(list(changed), np.int64)
        new = np.array(list(changed.values()), np.float64)
        self.weights[slots] = new
        if len(slots) and self.strategy == "per":
            self.max_seen = max(self.max_seen, float(new.max()))
        if self.strategy == "linucb":
            if len(slots):
                x = self.features[slots]
                self.linucb_scores(x[:1])  # creates A, b on first use
                self.A += x.T @ x
                self.b += x.T @ new
            unsampled = np.flatnonzero(self.visits[: self.size] == 0)
            if len(unsampled):
                self.weights[unsampled] = self.linucb_scores(self.features[unsampled])
        c = self.counters
        c["stale_feedback"] += stale
        c["first_visits"] += first
        c["updated"] += len(slots)
        return len(slots)
