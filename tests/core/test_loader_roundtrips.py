"""Checkpoint round trips of `ReplayDataLoader` and `RateLimiter` after legitimate use, by hypothesis, with the
harness of `test_checkpoint_roundtrips` (`check_resume`: cut a random sequence of calls, take the state through a
deep copy or a state file into a fresh and a used object, scribble over the loaded state, and demand the same
later outputs and final state, RuntimeWarnings as errors).

What docs/loader.md promises and so what is demanded: without workers "a resumed run is identical": every batch
after the cut (data, ids, probabilities, weights, ages, ``fresh``, ``produced``) and the final ``state_dict``,
for a plain source (fast-forwarded), a source with its own ``state_dict``, ``steps`` with a stateful producer
(``loader_state_dict``), ``replay_ratio`` (fractional too), ``min_size``, ``defer_feedback`` and an inline
`RateLimiter`. The loop is a real loop: it takes batches one at a time, finishes passes, breaks out of one and
starts the next, feeds losses back for the latest batch, for an older one (stale once evicted), twice, and for a
subset or with duplicate ids through ``loader.buffer`` under ``loader.lock``. A resumed loop's first ``iter``
continues the saved pass (as documented), so a cut never falls between a break and the next ``iter``.

With thread workers the docs promise less (when the loop samples depends on thread timing): only that the
buffer's contents and the number of batches resume exactly for a deterministic producer; that is what
`test_thread_workers_resume_the_buffer_contents` demands. ``aux`` is not in a state: a batch owed at the cut has
the ``aux`` of the step that produced it in the straight run, and ``None`` after a resume (as with workers).

Found here and fixed: a batch owed at the cut was lost or came after the next produced batch
(`test_a_batch_owed_at_the_checkpoint_comes_first_after_the_resume`,
`test_a_resumed_pass_broken_off_at_its_owed_batch_still_resumed_its_source`), and feedback still deferred when a state
was loaded reached the loaded buffer (`test_load_state_dict_drops_feedback_deferred_before_it`). Left out: a
source with its own ``state_dict`` together with ``steps`` shorter than the source. A pass that ``steps`` ends
leaves the source's iteration unfinished; the state then holds that position and the resumed loader's next pass
continues it, where the straight loader's next ``iter`` starts the source afresh. The loader has no general way
to tell a restored source "start a new pass" (the source may carry shuffle state across passes), so that is
reported, not fixed.
"""
from __future__ import annotations

import copy
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from replayloader import ReplayBuffer, ReplayDataLoader
from replayloader.loader import LimiterConfigError, RateLimiter
from replayloader.strategies import by_name

from .helpers import assert_state_equal
from .test_checkpoint_roundtrips import _cut, _long_ops, _ops, _roundtrip, check_resume

# A longer, random hunt: CHECKPOINT_FUZZ_EXAMPLES=1000 python -m pytest tests/core/test_loader_roundtrips.py
_HUNT = int(os.environ.get("CHECKPOINT_FUZZ_EXAMPLES", "0"))
SETTINGS = settings(max_examples=_HUNT or 400, deadline=None, derandomize=not _HUNT,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

MAX_ROWS = 5  # examples per produced batch, at most


# ------------------------------------------------------------------------------------------------ producers
def rows(key, n_max=MAX_ROWS):
    """A deterministic produced batch for ``key``: 1..n_max rows whose values say where they came from."""
    r = np.random.default_rng(key)
    n = int(r.integers(1, n_max + 1))
    return {"x": r.random((n, 2)).astype(np.float32), "key": np.full(n, key[-1], np.int64)}


class Item:
    """A producer of one item (a pure function of it): the docs' ``producer(item)`` with a source."""

    def __init__(self, seed):
        self.seed = seed

    def __call__(self, item):
        return rows([self.seed, int(item)]), {"item": int(item)}


class Counter:
    """A stateful producer (docs: ``loader_state_dict``): ``producer()`` with ``steps``, or ``producer(item)``,
    each batch depending on how many calls came before and on the last items seen."""

    def __init__(self, seed):
        self.seed, self.calls, self.recent = seed, 0, []

    def __call__(self, item=None):
        self.calls += 1
        self.recent = (self.recent + [0 if item is None else int(item)])[-2:]
        out = rows([self.seed, self.calls, *self.recent])
        out["recent"] = np.full(len(out["key"]), sum(self.recent), np.int64)
        return out, self.calls

    def loader_state_dict(self):
        return {"calls": self.calls, "recent": list(self.recent)}

    def load_loader_state_dict(self, state):
        self.calls, self.recent = int(state["calls"]), [int(v) for v in state["recent"]]


class Seekable:
    """A source with its own ``state_dict`` (torchdata's `StatefulDataLoader` in miniature): ``iter`` starts a new
    pass, except the first one after ``load_state_dict``, which continues at the saved position, or starts a new
    pass if the saved iteration had ended (run to its StopIteration)."""

    def __init__(self, items):
        self.items, self.position, self.finished, self._resume = list(items), 0, False, False

    def __iter__(self):  # like a DataLoader's, the new pass (or the resumed one) starts here, not at next()
        if not self._resume or self.finished:
            self.position, self.finished = 0, False
        self._resume = False
        return self._rest()

    def _rest(self):
        while self.position < len(self.items):
            self.position += 1
            yield self.items[self.position - 1]
        self.finished = True

    def __len__(self):
        return len(self.items)

    def state_dict(self):
        return {"position": self.position, "finished": self.finished}

    def load_state_dict(self, state):
        self.position, self.finished, self._resume = int(state["position"]), bool(state["finished"]), True


FEEDBACK_KEY = {"loss_diff": "loss", "loss": "loss", "per": "weight", "none": "loss"}


def make_loader(cfg):
    source = None
    items = [cfg["seed"] * 100 + i for i in range(cfg["items"])]
    if cfg["mode"] in ("plain", "plain_stateful"):
        source = items if cfg["seed"] % 2 else range(cfg["seed"] * 100, cfg["seed"] * 100 + cfg["items"])
    elif cfg["mode"] == "seekable":
        source = Seekable(items)
    producer = Counter(cfg["seed"]) if cfg["mode"] in ("steps", "plain_stateful") else Item(cfg["seed"])
    limiter = None
    if cfg["limiter"] is not None:
        spi, min_size, slack = cfg["limiter"]
        error_buffer = (MAX_ROWS * spi + cfg["batch_size"]) / 2 + slack  # never a LimiterConfigError
        limiter = RateLimiter(spi, min_size=min_size, error_buffer=error_buffer, timeout=5)
    return ReplayDataLoader(producer, ReplayBuffer(cfg["capacity"], strategy=by_name(cfg["strategy"]),
                                                   alpha=cfg["alpha"], seed=cfg["seed"]),
                            cfg["batch_size"], replay_ratio=cfg["replay_ratio"], source=source, steps=cfg["steps"],
                            min_size=cfg["min_size"], rate_limiter=limiter, defer_feedback=cfg["defer"])


@st.composite
def loader_configs(draw):
    mode = draw(st.sampled_from(["plain", "plain_stateful", "seekable", "steps"]))
    strategy = draw(st.sampled_from(["loss_diff", "loss_diff", "loss", "per", "none"]))
    limited = draw(st.booleans())
    capacity = draw(st.integers(MAX_ROWS, 9) | st.integers(10, 30))  # a produced batch fits
    # "none" returns the latest add, so a batch is at most its one row (produced batches have 1..MAX_ROWS)
    batch_size = 1 if strategy == "none" else draw(st.integers(1, 6))
    items = draw(st.integers(0, 12))
    # steps with a stateful source: see the module docstring
    steps = draw(st.integers(0, 12)) if mode == "steps" else None if mode == "seekable" else \
        draw(st.sampled_from([None, None, 3, 8]))
    return {"mode": mode, "strategy": strategy, "capacity": capacity, "batch_size": batch_size, "items": items,
            "steps": steps, "alpha": draw(st.sampled_from([0.0, 0.6, 1.0])),
            "replay_ratio": draw(st.sampled_from([1, 1, 0.5, 1.5, 2, 3])),
            "min_size": 0 if limited else draw(st.sampled_from([0, 0, 1, min(capacity, 6)])),
            "limiter": (draw(st.sampled_from([0.5, 1.0, 2.0, 4.0])), draw(st.integers(1, 12)),
                        draw(st.sampled_from([0.0, 1.0, 7.5]))) if limited else None,
            "defer": draw(st.booleans()), "seed": draw(st.integers(0, 5))}


# ------------------------------------------------------------------------------------------------ the loop
def _batch(loader, batch, context):
    """A batch as it must match; one owed at the cut (sampled before the loop's first add after it) carries
    ``fresh`` and ``aux`` of the add before the cut, which a state does not hold (a resumed loop gets none)."""
    owed = context.get("cut_adds") == loader.buffer.counters["add_calls"]
    hidden = ["owed", "owed"] if owed else [batch.fresh, batch.aux]
    return [batch.data, batch.ids, batch.probabilities, batch.weights, batch.ages, batch.produced] + hidden


def _next(loader, context):
    """The loop's next batch (a new pass's iterator first if it has none), or "end" when the pass ends."""
    if context["it"] is None:
        context["it"] = iter(loader)
    try:
        batch = next(context["it"])
    except StopIteration:
        context["it"] = None
        return "end"
    context["batches"] = (context["batches"] + [batch])[-4:]
    return _batch(loader, batch, context)


def _values(cfg, r, k):
    values = r.choice([0.0, 0.5, 2.0], k) if r.random() < 0.3 else r.random(k) * 3.0
    return {FEEDBACK_KEY[cfg["strategy"]]: values}


def run_loader_op(loader, op, context, i, cfg):
    kind, seed = op
    r = np.random.default_rng([seed, i])
    if kind in ("next", "rest", "break"):
        after_cut = context.pop("after_cut", False)
        if kind == "next":
            return _next(loader, context)
        if kind == "break":  # the loop breaks out of its pass and starts the next one (a new iter); right after
            if not after_cut:  # the cut a resumed loop is inside the saved pass with no iterator to break
                context["it"] = None
            return _next(loader, context)
        out = []  # "rest": the loop runs to the end of the pass, feeding every batch back
        while (got := _next(loader, context)) != "end":
            batch = context["batches"][-1]
            out.append([got, loader.feedback(batch, **_values(cfg, r, len(batch.ids)))])
        return out
    if kind in ("feedback", "feedback_again"):  # the latest batch, or an older one (stale once evicted)
        if not context["batches"]:
            return None
        batch = context["batches"][-1 - int(r.integers(0, len(context["batches"])))]
        out = [loader.feedback(batch, **_values(cfg, r, len(batch.ids)))]
        if kind == "feedback_again":
            out.append(loader.feedback(batch, **_values(cfg, r, len(batch.ids))))
        return out
    if kind == "feedback_ids":  # your own buffer call, under the lock: a subset, duplicates, shuffled
        if not context["batches"]:
            return None
        ids = context["batches"][-1 - int(r.integers(0, len(context["batches"])))].ids
        form = r.choice(["subset", "duplicates", "shuffled"])
        if form == "subset":
            ids = ids[r.random(len(ids)) < 0.5]
            ids = ids if len(ids) else context["batches"][-1].ids[:1]
        elif form == "duplicates":
            ids = np.concatenate([ids, r.choice(ids, int(r.integers(1, len(ids) + 1)))])
        else:
            ids = r.permutation(ids)
        with loader.lock:
            return [str(form), loader.buffer.feedback(ids, **_values(cfg, r, len(ids)))]
    if kind == "read":
        limiter = loader.rate_limiter
        return [len(loader), len(loader.buffer), loader.buffer.stats(),
                None if limiter is None else [limiter.state_dict(), limiter.stats()["samples_per_insert"]]]
    raise AssertionError(kind)


def _checkpoint(loader, context):
    """The state at the cut, and what a resumed loop knows then: the batches it received; its iterator is a new
    one (`iter` then continues the saved pass). Both loops mark the cut (see `_batch` and "break")."""
    state = loader.state_dict()
    context.update(after_cut=True, cut_adds=loader.buffer.counters["add_calls"])
    return state, {"it": None, "batches": copy.deepcopy(context["batches"]), "after_cut": True,
                   "cut_adds": context["cut_adds"]}


LOADER_OPS = ["next", "next", "next", "next", "rest", "break", "feedback", "feedback", "feedback_again",
              "feedback_ids", "read"]


@SETTINGS
@given(cfg=loader_configs(), ops_cut=_cut(_long_ops(LOADER_OPS, max_size=30)), other=_ops(LOADER_OPS, max_size=8),
       via=st.sampled_from(["copy", "file"]))
def test_replay_data_loader_resumes_exactly(cfg, ops_cut, other, via):
    ops, cut = ops_cut
    check_resume(lambda: make_loader(cfg), lambda lo, op, ctx, i: run_loader_op(lo, op, ctx, i, cfg), ops, cut,
                 other, via, lambda: {"it": None, "batches": []}, checkpoint=_checkpoint)


@pytest.mark.parametrize("limited", [False, True])
def test_a_batch_owed_at_the_checkpoint_comes_first_after_the_resume(limited):
    """A state taken between the batches one produced batch buys (replay_ratio 2, or a limiter admitting two):
    the resumed loop yields the second before it produces again, as the straight loop does."""
    def make():
        limiter = RateLimiter(1.0, min_size=1, error_buffer=4, timeout=5) if limited else None
        return ReplayDataLoader(Item(0), ReplayBuffer(16, seed=0), 2, source=range(3), replay_ratio=2,
                                rate_limiter=limiter)

    straight = make()
    batches = iter(straight)
    first = next(batches)
    state = straight.state_dict()
    rest = list(batches)
    resumed = make()
    resumed.load_state_dict(state)
    again = list(resumed)
    assert first.produced == 1 and [b.produced for b in rest] == ([1, 1, 1, 2, 3, 3, 3] if limited else
                                                                  [1, 2, 2, 3, 3])
    assert [b.produced for b in again] == [b.produced for b in rest]  # before the fix the owed ones were lost
    for a, b in zip(rest, again):
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.data["x"], b.data["x"])
    owed = sum(b.produced == 1 for b in rest)
    assert all(b.aux is None and not b.fresh.any() for b in again[:owed])  # aux and fresh are not in a state
    assert [b.aux for b in again[owed:]] == [b.aux for b in rest[owed:]] != [None] * (len(rest) - owed)


def test_a_resumed_pass_broken_off_at_its_owed_batch_still_resumed_its_source():
    """The resumed pass starts its source's iteration (a restored source continues there) before the owed batches:
    a loop that breaks off after them then gets a new pass of the source, as the straight loop does (the first
    owed-batch fix yielded them first, so the source's resume leaked into the next pass, which came out empty)."""
    cfg = {"mode": "seekable", "strategy": "loss_diff", "capacity": 5, "batch_size": 1, "items": 1, "steps": None,
           "alpha": 0.0, "replay_ratio": 1.5, "min_size": 0, "limiter": None, "defer": False, "seed": 0}
    ops = [("next", 0)] * 4 + [("break", 0)] + [("next", 0)] * 3  # cut after the third: one batch owed
    check_resume(lambda: make_loader(cfg), lambda lo, op, ctx, i: run_loader_op(lo, op, ctx, i, cfg), ops, 3,
                 [("next", 0)], "copy", lambda: {"it": None, "batches": []}, checkpoint=_checkpoint)


def test_load_state_dict_drops_feedback_deferred_before_it():
    """Deferred feedback still queued when a state is loaded was for the replaced buffer's examples: it must not
    reach the loaded one (before the fix the next flush applied it there, or refused ids it never issued)."""
    def make(seed):
        return ReplayDataLoader(Item(seed), ReplayBuffer(8, strategy=by_name("loss_diff"), seed=seed), 2,
                                source=range(4 + seed), defer_feedback=True)

    saved = make(0)
    for batch in saved:
        saved.feedback(batch, loss=np.ones(2))
    state = saved.state_dict()
    used = make(1)
    for batch in used:  # batch ids up to 5 * capacity: ids the loaded buffer never issued
        pass
    used.feedback(batch, loss=np.full(2, 5.0))  # queued, not yet applied
    used.load_state_dict(copy.deepcopy(state))
    assert_state_equal(state, used.state_dict(), "right after the load")


# ------------------------------------------------------------------------------------------------ RateLimiter
def run_limiter_op(limiter, op, context, i):
    """One call of a single-threaded user of the limiter: it acquires only what is admitted (a refused acquire
    would wait for the other side, which has no thread here), and ends a pass as the loader does."""
    kind, seed = op
    r = np.random.default_rng([seed, i])
    amount = int(r.integers(1, 7))
    if kind == "insert":
        admitted = limiter.can_insert(amount)
        if admitted and r.random() < 0.5:
            limiter.acquire_insert(amount)
        elif admitted:  # a single inserter counting the insert with its buffer call
            limiter.wait_insert(amount)
            limiter.record_insert(amount)
        return [amount, admitted]
    if kind == "sample":
        admitted = limiter.can_sample(amount)
        return [amount, admitted and limiter.acquire_sample(amount)]
    if kind == "end_pass":  # producers are done: a refused sample ends the pass; the next pass reopens
        limiter.finish_inserts()
        last = limiter.acquire_sample(amount)
        limiter.reopen()
        return [amount, last]
    if kind == "read":
        try:
            limiter.check_progress(amount, int(r.integers(1, 7)))
            fits = True
        except LimiterConfigError:
            fits = False
        stats = limiter.stats()
        return [limiter.state_dict(), limiter.diff, fits, [limiter.can_insert(n) for n in range(1, 7)],
                [limiter.can_sample(k) for k in range(1, 7)],
                [stats[key] for key in ("inserts", "samples", "samples_per_insert")]]
    raise AssertionError(kind)


@SETTINGS
@given(spi=st.sampled_from([0.25, 1.0, 2.0, 3.5]), min_size=st.integers(1, 10),
       error_buffer=st.sampled_from([0.5, 3.0, 8.0, 40.0]),
       ops_cut=_cut(_long_ops(["insert", "insert", "sample", "sample", "end_pass", "read"], max_size=40)),
       other=_ops(["insert", "sample", "end_pass"], max_size=10), via=st.sampled_from(["copy", "file"]))
def test_rate_limiter_resumes_exactly(spi, min_size, error_buffer, ops_cut, other, via):
    ops, cut = ops_cut
    check_resume(lambda: RateLimiter(spi, min_size=min_size, error_buffer=error_buffer, timeout=5), run_limiter_op,
                 ops, cut, other, via, dict)


# ------------------------------------------------------------------------------------------------ thread workers
def _fifo_rows(item):
    return {"x": np.arange(3 * item, 3 * item + 3), "y": np.full(3, item * 0.5)}


@pytest.mark.parametrize("ratio, limited, workers, cut", [(1, False, 2, 4), (0.5, False, 3, 2), (2, False, 1, 9),
                                                          (1, True, 2, 6), (1, True, 3, 0)])
def test_thread_workers_resume_the_buffer_contents(ratio, limited, workers, cut):
    """With thread workers the docs promise the buffer's contents (for a deterministic producer) and the number
    of batches, not when the loop samples: a resumed pass re-produces what was in flight, in item order."""
    def make():
        limiter = RateLimiter(2.0, min_size=6, error_buffer=12, timeout=30) if limited else None
        return ReplayDataLoader(_fifo_rows, ReplayBuffer(24, strategy=by_name("per"), seed=1), 4, source=range(25),
                                replay_ratio=ratio, workers=workers, rate_limiter=limiter)

    def contents(loader):
        state = loader.state_dict()
        buffer = state["buffer"]
        return [state["step"], state["consumed"], state.get("rate_limiter"), buffer["size"], buffer["next_serial"],
                buffer["slot_serial"], buffer["storage"]]

    straight = make()
    taken, saved = 0, None
    for taken, batch in enumerate(straight, 1):
        straight.feedback(batch, weight=np.full(4, 0.5 + taken % 3))
        if taken == cut + 1:
            saved = _roundtrip(straight.state_dict(), "file")
    resumed = make()
    resumed.load_state_dict(saved)
    after = 0
    for after, batch in enumerate(resumed, 1):
        resumed.feedback(batch, weight=np.full(4, 1.0))
    assert taken == cut + 1 + after > cut + 1
    assert_state_equal(contents(straight), contents(resumed), "after the pass")
