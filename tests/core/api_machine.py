"""A hypothesis state machine over the public API of ReplayBuffer and ReplayDataLoader.

Every rule calls the real object and the plain-numpy `ReferenceBuffer` alike (or expects the same error, after
which the real state must be unchanged); after every rule the two are compared field by field. Shared by the CI
test (`test_api_state_machine.py`) and the longer nightly run (`checks/fuzz_api.py`).
"""
from __future__ import annotations

import copy

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, precondition, rule

from replayloader import ReplayBuffer, ReplayDataLoader
from replayloader.state import flatten_state
from replayloader.state import unflatten_state
from replayloader.strategies import by_name, strategy_names

from .helpers import assert_state_equal
from .invariants import check_buffer_invariants
from .reference_model import FEEDBACK_KEY, INIT, LOSS_DIFF, ModelError, ReferenceBuffer

FEATURE_BASED = ("lsr", "linucb")
feedback_values = st.one_of(st.floats(0, 10, allow_nan=False), st.sampled_from([0.0, 1.0, 2.5]))
seeds = st.integers(0, 2**16)
bad_values = st.sampled_from([np.nan, np.inf, -1.0])


class BufferAPIMachine(RuleBasedStateMachine):
    sampled = Bundle("sampled_ids")
    snapshots = Bundle("snapshots")

    @initialize(capacity=st.integers(1, 8), alpha=st.sampled_from([0.0, 0.5, 1.0]),
                beta=st.sampled_from([None, 0.4]), strategy=st.sampled_from(strategy_names()),
                sampling=st.sampled_from(["stratified", "independent"]), seed=st.integers(0, 2**32 - 1))
    def setup(self, capacity, alpha, beta, strategy, sampling, seed):
        self.config = dict(capacity=capacity, alpha=alpha, beta=beta, sampling=sampling, seed=seed)
        self.name = strategy
        self.buffer = self.new_buffer()
        self.model = ReferenceBuffer(capacity, alpha, beta, strategy)
        self.tag = 0  # a unique label per added example, to see that rows stay with their slots
        self.loader = None

    def new_buffer(self) -> ReplayBuffer:
        return ReplayBuffer(strategy=by_name(self.name), **self.config)

    def make_batch(self, n: int, seed: int) -> dict:
        """n examples: small token ids (so features repeat and weights tie) and a unique label each."""
        labels = np.arange(self.tag, self.tag + n, dtype=np.float32)
        self.tag += n
        return {"input_ids": np.random.default_rng(seed).integers(0, 5, (n, 2)), "label": labels}

    def expect(self, call, model_call):
        """Run both; when the model expects an error, the buffer must raise it and stay as it was."""
        try:
            expected = model_call()
        except ModelError as error:
            before = self.buffer.state_dict()  # copies
            try:
                call()
            except error.kind as raised:
                assert error.fragment in str(raised), (error.fragment, str(raised))
            else:
                raise AssertionError(f"expected {error.kind.__name__} containing {error.fragment!r}")
            assert_state_equal(self.buffer.state_dict(), before)
            return None
        return call(), expected

    # ------------------------------------------------------------------ buffer rules
    @rule(n=st.integers(1, 9), seed=seeds)
    def add(self, n, seed):
        batch = self.make_batch(n, seed)
        out = self.expect(lambda: self.buffer.add(batch), lambda: self.model.add(batch))  # errors change nothing
        if out is not None:
            same(out[0], out[1], "ids")
            self.adopt_initial_weights(out[0])

    def adopt_initial_weights(self, ids):
        """Feature-based initial weights come from a linear solve: equal to rounding, then taken over."""
        slots = ids % self.buffer.capacity
        loose = self.name in FEATURE_BASED
        np.testing.assert_allclose(self.buffer.weights[slots], self.model.weights[slots],
                                   rtol=1e-4 if loose else 1e-12, atol=1e-5 if loose else 0)
        self.model.weights[slots] = self.buffer.weights[slots]

    @rule(target=sampled, k=st.integers(1, 10))
    def sample(self, k):
        out = self.expect(lambda: self.buffer.sample(k), lambda: self.model.legal_sample(k))
        if out is None:
            return np.array([-1], np.int64)
        self.model.check_sample(out[0], k)
        return out[0].ids

    @rule(ids=sampled, seed=seeds)
    def update_valid_or_stale(self, ids, seed):
        rng = np.random.default_rng(seed)  # ties (0, 1, 2.5 repeat) as well as arbitrary values
        values = np.where(rng.random(len(ids)) < 0.5, rng.choice([0.0, 1.0, 2.5], len(ids)), rng.random(len(ids)) * 10)
        self.feedback(ids, FEEDBACK_KEY[self.name] or "loss", values)

    @rule(ids=sampled, bad=bad_values, where=st.integers(0, 9))
    def update_invalid_value(self, ids, bad, where):
        values = np.ones(len(ids))
        values[where % len(ids)] = bad
        self.feedback(ids, FEEDBACK_KEY[self.name] or "loss", values)

    @rule(ids=sampled, shift=st.sampled_from([10**6, -(10**6)]))
    def update_never_issued(self, ids, shift):
        self.feedback(ids + shift * self.buffer.capacity, FEEDBACK_KEY[self.name] or "loss", np.ones(len(ids)))

    @rule(ids=sampled, key=st.sampled_from(["loss", "grad_norm", "weight"]))
    def update_any_keyword(self, ids, key):
        self.feedback(ids, key, np.full(len(ids), 0.5))

    def feedback(self, ids, key, values, via=None):
        call = via or self.buffer.feedback
        out = self.expect(lambda: call(ids, **{key: values}), lambda: self.model.update(ids, key, values))
        if out is not None:
            assert out[0] == out[1], f"update changed {out[0]} weights, the model {out[1]}"
            if self.name == "linucb":  # re-scored unsampled examples: a linear solve again
                self.adopt_initial_weights(np.arange(len(self.buffer)))

    # ------------------------------------------------------------------ checkpoints
    @rule(target=snapshots)
    def snapshot(self):
        return self.buffer.state_dict(), copy.deepcopy(self.model)

    @rule(snap=snapshots)
    def restore(self, snap):
        state, model = snap
        self.buffer.load_state_dict(state)
        self.model = copy.deepcopy(model)
        self.loader = None

    @rule(k=st.integers(1, 4))
    def move_to_a_fresh_buffer(self, k):
        """Flatten (as for a file), load into a new buffer: both must draw the same sample next."""
        arrays, meta = flatten_state(self.buffer.state_dict())
        fresh = self.new_buffer()
        fresh.load_state_dict(unflatten_state(arrays, meta))
        if len(self.buffer) and not (self.name == "none" and k > len(self.buffer.last_add_slots)):
            a, b = self.buffer.sample(k), fresh.sample(k)
            np.testing.assert_array_equal(a.ids, b.ids)
            np.testing.assert_array_equal(a.probabilities, b.probabilities)
            self.model.check_sample(a, k)
        self.buffer, self.loader = fresh, None

    # ------------------------------------------------------------------ the loader around the same buffer
    def ensure_loader(self):
        if self.loader is None:
            self.loader = ReplayDataLoader(lambda: self.pending, self.buffer, batch_size=1, steps=10**9)
            self.batches = iter(self.loader)

    @rule(n=st.integers(1, 8), seed=seeds)
    def loader_step(self, n, seed):
        if n > self.buffer.capacity:
            return
        self.ensure_loader()
        self.pending = self.make_batch(n, seed)
        step = self.loader.step
        batch = next(self.batches)
        ids = self.model.add(self.pending)
        self.adopt_initial_weights(ids)
        self.model.check_sample(batch, 1)
        assert batch.produced == step + 1
        np.testing.assert_array_equal(batch.fresh, np.isin(batch.ids, ids))
        self.last_batch = batch

    @precondition(lambda self: getattr(self, "last_batch", None) is not None and self.loader is not None)
    @rule(value=feedback_values)
    def loader_feedback(self, value):
        self.feedback(self.last_batch.ids, FEEDBACK_KEY[self.name] or "loss", np.array([value]),
                      via=lambda ids, **kw: self.loader.feedback(self.last_batch, **kw))

    @precondition(lambda self: self.loader is not None)
    @rule()
    def loader_checkpoint_roundtrip(self):
        """A loader state loaded into a new loader over a new buffer continues at the same step and sample."""
        state = self.loader.state_dict()
        fresh = self.new_buffer()
        loader = ReplayDataLoader(lambda: self.pending, fresh, batch_size=1, steps=10**9)
        loader.load_state_dict(state)
        assert loader.step == self.loader.step
        assert_state_equal(fresh.state_dict(), self.buffer.state_dict())
        self.buffer, self.loader = fresh, loader
        self.batches = iter(loader)

    # ------------------------------------------------------------------ the comparison after every rule
    @invariant()
    def matches_the_model(self):
        if not hasattr(self, "model"):
            return
        buf, model = self.buffer, self.model
        check_buffer_invariants(buf)
        assert len(buf) == model.size and buf.next_serial == model.next_serial
        same(buf.slot_serial, model.serial, "slot serials")
        same(buf.visits, model.visits, "visits")
        same(buf.meta[:, 1], model.added_at, "add call of each slot")
        same(buf.last_add_slots, model.last_add, "slots of the last add")
        assert np.allclose(buf.weights, model.weights, rtol=1e-12, atol=0), (buf.weights, model.weights)
        model.weights[:] = buf.weights  # same to rounding: keep the eviction order of both identical
        assert buf.counters == model.counters, (buf.counters, model.counters)
        for name, rows in model.rows.items():
            same(buf.storage.fields[name][: model.size], rows[: model.size], f"stored {name}")
        strategy = buf.strategy
        if self.name in LOSS_DIFF:
            same(strategy.update.last_loss, model.last_loss, "last losses")
        if model.evict == "fifo":
            assert strategy.evict.next_slot == model.fifo_next
        if self.name == "per":
            assert strategy.init.max_seen == model.max_seen


def same(a: np.ndarray, b: np.ndarray, what: str) -> None:
    assert np.array_equal(a, b, equal_nan=True), f"{what} differ: buffer {a}, model {b}"
