"""Checkpoint round trips after legitimate use, by hypothesis: a random sequence of legitimate calls on a public
stateful object, cut at a random point; its ``state_dict`` goes through a deep copy or a state file
(`save_state` / `load_state`, or pickle for the SB3 buffer) into (a) a fresh object of the same settings and (b)
one of the same settings that already made other calls; both must continue exactly as the uninterrupted object
(every output of every later call, and the final state), with RuntimeWarnings raised as errors. The loaded
state is scribbled over after the load, so an object that kept the caller's arrays instead of copies diverges.

Legitimate use, as the docstrings and docs/*.md describe it: feedback with duplicate indices, for a subset of a
batch, twice for the same batch, for an older batch (plain indices or the `SampledBatch` with its epoch), calls
across warm-up passes and epoch ends, ``uniform_fraction``, every built-in initializer and update rule, evictions
when a buffer is full, stale ids, a DataLoader's prefetching and ``set_epoch`` (simulated in one process).

The case this found in `PrioritizedBatchSampler.set_epoch` (a resumed loop that had ended its epoch early kept
that epoch's unreceived batches) is pinned by `test_set_epoch_after_resume_drops_batches_of_an_epoch_ended_early`.
"""
from __future__ import annotations

import copy
import os
import pickle
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from replayloader import LinearSchedule, PrioritizedSampler, ReplayBuffer, load_state, save_state
from replayloader.selection import (Proportional, ReducibleLoss, ScoreThenSelect, SelectiveBackprop, Selector, TopK,
                                    TrainingLoss)
from replayloader.strategies import (FIFO, EvictLowest, GradBound, GradNorm, LeastSquares, LinUCB, LossDifference,
                                     LossValue, MaxWeight, MeanWeight, NoReplay, ReducibleLossPrior,
                                     ReducibleLossUpdate, SetWeight, Strategy)

from .helpers import assert_state_equal

# A longer, random hunt: CHECKPOINT_FUZZ_EXAMPLES=3000 python -m pytest tests/core/test_checkpoint_roundtrips.py
_HUNT = int(os.environ.get("CHECKPOINT_FUZZ_EXAMPLES", "0"))
SETTINGS = settings(max_examples=_HUNT or 300, deadline=None, derandomize=not _HUNT,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ------------------------------------------------------------------------------------------------ the harness
def _roundtrip(state, via, what="state"):
    if via == "copy":
        return copy.deepcopy(state)
    if via == "pickle":
        return pickle.loads(pickle.dumps(state))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{what}.npz"
        save_state(state, path)
        return load_state(path)


def _scribble(node):
    """Overwrite every array of a (loaded) state in place: an object must not keep the caller's arrays."""
    if isinstance(node, dict):
        for value in node.values():
            _scribble(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            _scribble(value)
    elif isinstance(node, np.ndarray) and node.flags.writeable and node.size:
        if node.dtype.kind == "b":
            node ^= True
        elif node.dtype.kind in "iuf":
            node[...] = 3
    elif type(node).__module__.startswith("torch"):
        node.fill_(3)


def check_resume(make, run_op, ops, cut, other_ops, via, new_context, load=None, resumed=copy.deepcopy, *,
                 checkpoint=None, comparable=lambda s: s, settle=lambda obj, context: None):
    """The property: ``ops[:cut]`` on one object, checkpoint, ``ops[cut:]`` on it, on a fresh one loaded from
    the checkpoint and on a used one loaded from it; every later output and the final state equal.
    ``resumed(context)``: what a resumed run's caller knows at the cut (default: all the straight run knew);
    ``checkpoint(obj, context) -> (state, resumed context)`` replaces ``state_dict()`` and ``resumed`` where a
    loader takes its own kind of state; ``comparable`` maps an output or a state to what must match;
    ``settle(obj, context)`` ends each run (e.g. a loader's read-ahead) before its final state is taken."""
    load = load or (lambda obj, state: obj.load_state_dict(state))
    checkpoint = checkpoint or (lambda obj, context: (obj.state_dict(), resumed(context)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        straight, context = make(), new_context()
        for i, op in enumerate(ops[:cut]):
            run_op(straight, op, context, i)
        state, at_cut = checkpoint(straight, context)
        kept = copy.deepcopy(state)
        saved = _roundtrip(state, via)
        tail = [run_op(straight, op, context, i) for i, op in enumerate(ops[cut:], cut)]
        settle(straight, context)
        final = straight.state_dict()
        assert_state_equal(kept, state, "state taken at the cut (changed by later calls)")

        used, used_context = make(), new_context()
        for i, op in enumerate(other_ops):
            run_op(used, op, used_context, 10_000 + i)
        for name, obj in (("fresh", make()), ("used", used)):
            given_state = copy.deepcopy(saved)
            load(obj, given_state)
            assert_state_equal(kept, obj.state_dict(), f"{name}: state right after the load")
            _scribble(given_state)
            ctx = copy.deepcopy(at_cut)
            again = [run_op(obj, op, ctx, i) for i, op in enumerate(ops[cut:], cut)]
            settle(obj, ctx)
            assert_state_equal(comparable(tail), comparable(again), f"{name}: outputs after the load")
            assert_state_equal(comparable(final), comparable(obj.state_dict()), f"{name}: final state")


def _ops(kinds, max_size=40, min_size=1):
    kind = st.sampled_from(kinds)
    return st.lists(st.tuples(kind, st.integers(0, 2**31 - 1)), min_size=min_size, max_size=max_size)


def _long_ops(kinds, max_size=40):
    """`_ops` of at least 8 calls, so most cuts fall after some use."""
    return _ops(kinds, max_size, min_size=8)


def _cut(ops_strategy):
    return ops_strategy.flatmap(lambda ops: st.tuples(st.just(ops), st.integers(0, len(ops))))


# ------------------------------------------------------------------------------------------------ PrioritizedSampler
N_FEATURES = 3


def _features(n):
    return np.random.default_rng(7).random((n, N_FEATURES)) * 2.0


def _irreducible(n):
    return np.random.default_rng(11).random(n) * 2.0


UPDATES = ["loss", "loss_diff", "loss_diff_decrease", "grad_norm", "grad_bound", "grad_bound_logits", "weight",
           "reducible"]
INITS = ["mean", "max", "lsr", "linucb", "reducible_prior"]


def make_update(kind, n):
    return {"loss": lambda: LossValue(), "loss_diff": lambda: LossDifference(),
            "loss_diff_decrease": lambda: LossDifference("decrease", floor=0.01), "grad_norm": lambda: GradNorm(),
            "grad_bound": lambda: GradBound(), "grad_bound_logits": lambda: GradBound(),
            "weight": lambda: SetWeight(), "reducible": lambda: ReducibleLossUpdate(_irreducible(n), seed=3)}[kind]()


def make_sampler(cfg):
    n = cfg["n"]
    init = {"mean": MeanWeight(), "max": MaxWeight(0.5), "lsr": LeastSquares(intercept=True), "linucb": LinUCB(),
            "reducible_prior": ReducibleLossPrior(initial_loss=1.5)}[cfg["init"]]
    features = None
    if cfg["init"] in ("lsr", "linucb"):
        features = _features(n)
    elif cfg["init"] == "reducible_prior":
        features = _irreducible(n)[:, None]
    beta = {"none": None, "half": 0.5, "schedule": LinearSchedule(0.4, 1.0, 7)}[cfg["beta"]]
    return PrioritizedSampler(n, cfg["batch_size"], alpha=cfg["alpha"], beta=beta,
                              update=make_update(cfg["update"], n), init=init, sampling=cfg["sampling"],
                              uniform_fraction=cfg["uniform_fraction"], floor=cfg["floor"],
                              warmup_epochs=cfg["warmup_epochs"], features=features, seed=cfg["seed"])


def feedback_values(kind, r, k):
    """Per-example feedback of one call: the keywords the update reads, some values repeated or 0."""
    values = r.choice([0.0, 1e-9, 0.25, 1.0, 3.0, 1e6], k) if r.random() < 0.3 else r.random(k) * 4.0
    if kind == "grad_bound_logits":
        return {"logits": r.normal(size=(k, 3)), "targets": r.integers(0, 3, k)}
    key = {"grad_norm": "grad_norm", "grad_bound": "grad_bound", "weight": "weight"}.get(kind, "loss")
    return {key: values}


def sampler_feedback(sampler, update_kind, context, r):
    """Feedback for a batch drawn earlier, in one of its legitimate forms (None when nothing was drawn)."""
    batches = context["batches"]
    if not batches:
        return None
    batch = batches[-1 - int(r.integers(0, min(len(batches), 4)))]
    form = r.choice(["batch", "indices", "list", "subset", "duplicates", "shuffled"])
    target, k = batch, len(batch)
    if form == "indices":
        target = batch.indices.copy()
    elif form == "list":
        target = batch.indices.tolist()
    elif form == "subset":
        target = batch.indices[r.random(k) < 0.5]
        if not len(target):
            target = batch.indices[:1]
    elif form == "duplicates":
        target = np.concatenate([batch.indices, r.choice(batch.indices, int(r.integers(1, k + 1)))])
    elif form == "shuffled":
        target = r.permutation(batch.indices)
    size = len(target) if form != "batch" else k
    changed = sampler.feedback(target, **feedback_values(update_kind, r, size))
    return [str(form), changed]


def run_sampler_op(sampler, op, context, i, update_kind):
    kind, seed = op
    r = np.random.default_rng([seed, i])
    if kind == "draw":
        batch = sampler.next_batch()
        context["batches"].append(batch)
        return [batch.indices, batch.probabilities, batch.weights, batch.epoch, batch.step]
    if kind == "rest_of_epoch":  # iter(sampler): the remaining batches of the current epoch
        out = []
        for batch in sampler:
            context["batches"].append(batch)
            out.append([batch.indices, batch.weights, batch.epoch])
        return out
    if kind in ("feedback", "feedback_again"):
        out = sampler_feedback(sampler, update_kind, context, r)
        if kind == "feedback_again" and out is not None:  # the same batch twice (a repeated call)
            out.append(sampler_feedback(sampler, update_kind, {"batches": context["batches"][-1:]}, r))
        return out
    if kind == "read":
        return [sampler.probabilities(), sampler.current_beta(), {k: v for k, v in sampler.stats().items()}]
    raise AssertionError(kind)


SAMPLER_OPS = ["draw", "draw", "draw", "feedback", "feedback", "feedback_again", "rest_of_epoch", "read"]


@st.composite
def sampler_configs(draw, updates=tuple(UPDATES), inits=tuple(INITS)):
    return {"n": draw(st.integers(1, 9) | st.integers(10, 40)),
            "batch_size": draw(st.integers(1, 5) | st.integers(6, 12)),
            "alpha": draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])),
            "beta": draw(st.sampled_from(["none", "half", "schedule"])),
            "update": draw(st.sampled_from(updates)), "init": draw(st.sampled_from(inits)),
            "sampling": draw(st.sampled_from(["stratified", "independent"])),
            "uniform_fraction": draw(st.sampled_from([0.0, 0.3, 1.0])),
            "floor": draw(st.sampled_from([1e-6, 0.05])), "warmup_epochs": draw(st.integers(0, 2)),
            "seed": draw(st.integers(0, 3))}


@SETTINGS
@given(cfg=sampler_configs(), ops_cut=_cut(_ops(SAMPLER_OPS)), other=_ops(SAMPLER_OPS, max_size=12),
       via=st.sampled_from(["copy", "file"]))
def test_prioritized_sampler_resumes_exactly(cfg, ops_cut, other, via):
    ops, cut = ops_cut
    check_resume(lambda: make_sampler(cfg),
                 lambda s, op, ctx, i: run_sampler_op(s, op, ctx, i, cfg["update"]),
                 ops, cut, other, via, lambda: {"batches": []})


# ------------------------------------------------------------------------------------------------ ReplayBuffer
BUFFER_UPDATES = ["loss_diff", "loss_diff_decrease", "loss", "grad_norm", "grad_bound", "grad_bound_logits",
                  "weight", "none"]


def make_buffer(cfg):
    if cfg["update"] == "none":
        strategy = NoReplay()
    else:
        init = {"mean": MeanWeight(), "max": MaxWeight(), "lsr": LeastSquares(), "linucb": LinUCB()}[cfg["init"]]
        evict = {"lowest": EvictLowest(), "fifo": FIFO()}[cfg["evict"]]
        strategy = Strategy(init, make_update(cfg["update"], cfg["capacity"]), evict)
    beta = {"none": None, "half": 0.5, "schedule": LinearSchedule(0.4, 1.0, 5)}[cfg["beta"]]
    return ReplayBuffer(cfg["capacity"], alpha=cfg["alpha"], beta=beta, strategy=strategy, seed=cfg["seed"],
                        sampling=cfg["sampling"], tree_dtype=cfg["tree_dtype"])


def run_buffer_op(buffer, op, context, i, cfg):
    kind, seed = op
    r = np.random.default_rng([seed, i])
    if kind == "add":
        n = int(r.integers(1, cfg["capacity"] + 1))
        batch = {"input_ids": r.integers(0, 5, (n, 3)), "x": r.random((n, 2)).astype(np.float32),
                 "flag": r.random(n) < 0.5}
        if cfg["torch_field"]:
            import torch

            batch["t"] = torch.as_tensor(r.random((n, 2)), dtype=torch.float32)
        ids = buffer.add(batch)
        context["ids"].append(ids)
        return ids
    if kind == "sample":
        if not len(buffer):
            return None
        k = int(r.integers(1, 6))
        if cfg["update"] == "none":
            k = min(k, len(buffer.last_add_slots))
        s = buffer.sample(k)
        context["ids"].append(s.ids)
        data = {key: (v.numpy() if hasattr(v, "numpy") else v) for key, v in s.data.items()}
        return [s.ids, s.probabilities, s.weights, s.ages, data]
    if kind in ("feedback", "feedback_again"):
        if not context["ids"]:
            return None
        ids = context["ids"][-1 - int(r.integers(0, min(len(context["ids"]), 5)))]  # older ids may be stale
        form = r.choice(["all", "subset", "duplicates", "shuffled", "list"])
        if form == "subset":
            ids = ids[r.random(len(ids)) < 0.5] if len(ids) > 1 else ids
            ids = ids if len(ids) else context["ids"][-1][:1]
        elif form == "duplicates":
            ids = np.concatenate([ids, r.choice(ids, int(r.integers(1, len(ids) + 1)))])
        elif form == "shuffled":
            ids = r.permutation(ids)
        elif form == "list":
            ids = ids.tolist()
        update = "loss" if cfg["update"] == "none" else cfg["update"]
        out = [buffer.feedback(ids, **feedback_values(update, r, len(ids)))]
        if kind == "feedback_again":
            out.append(buffer.feedback(ids, **feedback_values(update, r, len(ids))))
        return out
    if kind == "read":
        return [buffer.stats(), buffer.mean_weight(), buffer.current_beta(), len(buffer)]
    raise AssertionError(kind)


BUFFER_OPS = ["add", "add", "sample", "sample", "feedback", "feedback", "feedback_again", "read"]


@st.composite
def buffer_configs(draw):
    update = draw(st.sampled_from(BUFFER_UPDATES))
    return {"capacity": draw(st.integers(1, 10) | st.integers(11, 40)),
            "alpha": draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])),
            "beta": draw(st.sampled_from(["none", "half", "schedule"])), "update": update,
            "init": draw(st.sampled_from(["mean", "max", "lsr", "linucb"])),
            "evict": draw(st.sampled_from(["lowest", "fifo"])),
            "sampling": draw(st.sampled_from(["stratified", "independent"])),
            "tree_dtype": draw(st.sampled_from([np.float64, np.float32])), "seed": draw(st.integers(0, 3)),
            "torch_field": draw(st.booleans())}


@SETTINGS
@given(cfg=buffer_configs(), ops_cut=_cut(_ops(BUFFER_OPS)), other=_ops(BUFFER_OPS, max_size=12),
       via=st.sampled_from(["copy", "file"]))
def test_replay_buffer_resumes_exactly(cfg, ops_cut, other, via):
    if cfg["torch_field"]:
        pytest.importorskip("torch")
    ops, cut = ops_cut
    check_resume(lambda: make_buffer(cfg), lambda b, op, ctx, i: run_buffer_op(b, op, ctx, i, cfg),
                 ops, cut, other, via, lambda: {"ids": []})


# ------------------------------------------------------------------------------------------------ ScoreThenSelect
def make_selector(cfg, n):
    from replayloader.selection import ReusedPool

    rule = {"top_k": lambda: TopK(cfg["k"]),
            "proportional": lambda: Proportional(cfg["k"], alpha=cfg["rule_alpha"], beta=0.7),
            "selective_backprop": lambda: SelectiveBackprop(selectivity=cfg["rule_alpha"], history=cfg["history"],
                                                            min_keep=0.1)}[cfg["rule"]]()
    score = ReducibleLoss(_irreducible(n)) if cfg["score"] == "reducible" else TrainingLoss()
    selector = Selector(rule, score, seed=cfg["seed"])
    if cfg["pool_steps"] and rule.k is not None:
        return ReusedPool(selector, steps=cfg["pool_steps"], rerank=cfg["rerank"])
    return selector


def make_score_then_select(cfg):
    sampler = make_sampler(cfg["sampler"])
    return ScoreThenSelect(sampler, make_selector(cfg, cfg["sampler"]["n"]), refresh=cfg["refresh"])


def _selection(sel):
    return [sel.positions, sel.indices, sel.weights, sel.scores, sel.probabilities]


def run_selection_op(select, op, context, i):
    kind, seed = op
    r = np.random.default_rng([seed, i])
    selector = select.selector
    pending = getattr(selector, "pending_steps", 0)
    if kind == "step":  # the training loop: the pool's next step, else a new candidate batch, scored and chosen
        if pending:
            return ["next", _selection(selector.next_step())]
        candidates = select.next_candidates()
        context["candidates"].append(candidates)
        losses = r.random(len(candidates)) * 3.0
        return ["new", candidates.indices, candidates.weights, _selection(select.choose(candidates, losses))]
    if kind == "choose_older":  # a candidate batch drawn earlier, scored again (e.g. after a retried step)
        if pending or not context["candidates"]:
            return None
        candidates = context["candidates"][-1 - int(r.integers(0, min(len(context["candidates"]), 3)))]
        losses = r.choice([0.0, 1.0, 2.5], len(candidates)) if r.random() < 0.4 else r.random(len(candidates))
        return _selection(select.choose(candidates, losses))
    if kind == "feedback":  # the training forward's losses of the trained rows, fed back by the loop too
        return sampler_feedback(select.sampler, "loss", context, r) if select.sampler.update_rule.feedback_key \
            == "loss" else None
    if kind == "read":
        return [select.selector.stats(), select.sampler.stats()]
    raise AssertionError(kind)


SELECTION_OPS = ["step", "step", "step", "choose_older", "feedback", "read"]


@st.composite
def selection_configs(draw):
    sampler = draw(sampler_configs(updates=("loss", "loss_diff", "reducible"), inits=("mean", "max", "linucb")))
    sampler["n"] = draw(st.integers(2, 9))
    sampler["batch_size"] = draw(st.integers(2, 6))
    rule = draw(st.sampled_from(["top_k", "proportional", "selective_backprop"]))
    k = draw(st.integers(1, sampler["batch_size"]))
    pool_steps = draw(st.sampled_from([0, 0, 1, 2, 3]))
    pool_steps = pool_steps if pool_steps * k <= sampler["batch_size"] else 0
    return {"sampler": sampler, "rule": rule, "k": k, "rule_alpha": draw(st.sampled_from([0.0, 1.0, 2.0])),
            "history": draw(st.integers(1, 12)), "score": draw(st.sampled_from(["training", "reducible"])),
            "seed": draw(st.integers(0, 3)), "refresh": draw(st.booleans()), "pool_steps": pool_steps,
            "rerank": draw(st.booleans())}


@SETTINGS
@given(cfg=selection_configs(), ops_cut=_cut(_ops(SELECTION_OPS)), other=_ops(SELECTION_OPS, max_size=12),
       via=st.sampled_from(["copy", "file"]))
def test_score_then_select_resumes_exactly(cfg, ops_cut, other, via):
    ops, cut = ops_cut
    check_resume(lambda: make_score_then_select(cfg), run_selection_op, ops, cut, other, via,
                 lambda: {"candidates": [], "batches": []})


def run_selector_op(selector, op, context, i):
    """A `Selector` on its own: one batch, or one split in slices (DDP ranks), short batches of a pass."""
    kind, seed = op
    r = np.random.default_rng([seed, i])
    n_b = context["n_b"]
    k = selector.rule.k
    if kind == "choose":
        short = r.random() < 0.2
        size = int(r.integers(1, n_b + 1)) if short else n_b
        losses = r.random(size) * 2.0
        indices = r.integers(0, context["n"], size)
        weights = r.random(size) + 0.5
        return _selection(selector.choose(losses, indices, weights, short_batch=short))
    if kind == "split":
        slices = [s for s in (1, 2, 3) if (k is None or k % s == 0) and n_b % s == 0]
        count = int(r.choice(slices))
        size = n_b // count
        losses = [r.random(size) for _ in range(count)]
        indices = [r.integers(0, context["n"], size) for _ in range(count)]
        return [_selection(s) for s in selector.choose_split(losses, indices)]
    if kind == "read":
        return selector.stats()
    raise AssertionError(kind)


@SETTINGS
@given(cfg=selection_configs(), ops_cut=_cut(_ops(["choose", "choose", "split", "read"])),
       other=_ops(["choose", "split"], max_size=8), via=st.sampled_from(["copy", "file"]))
def test_selector_resumes_exactly(cfg, ops_cut, other, via):
    ops, cut = ops_cut
    n, n_b = cfg["sampler"]["n"], cfg["sampler"]["batch_size"]
    cfg = {**cfg, "pool_steps": 0}
    check_resume(lambda: make_selector(cfg, n), run_selector_op, ops, cut, other, via,
                 lambda: {"n": n, "n_b": n_b})


# ---------------------------------------------------------------------------------------- PrioritizedBatchSampler
def _loop_context(depth):
    """A one-process DataLoader loop over a batch sampler: ``depth`` index lists drawn ahead of the loop (W·P).
    ``in_epoch``: the loop is inside ``loop_epoch``; ``it`` None: it has no DataLoader iterator (yet)."""
    return {"it": None, "queue": [], "exhausted": False, "loop_epoch": 0, "in_epoch": False, "depth": depth,
            "batches": []}


def _resumed_loop(context):
    """What a resumed run knows at the cut: the loop's epoch (and whether it was inside it), the batches received
    before; its DataLoader iterator is a new one."""
    return {**_loop_context(context["depth"]), "loop_epoch": context["loop_epoch"],
            "in_epoch": context["in_epoch"], "batches": copy.deepcopy(context["batches"])}


def _start_epoch(batches, context):
    """An epoch (re)starts, as Lightning runs it: set_epoch, a new iterator, its prefetch."""
    batches.set_epoch(context["loop_epoch"])
    context.update(it=iter(batches), queue=[], exhausted=False, in_epoch=True)
    _fill(context)


def _fill(context):
    while not context["exhausted"] and len(context["queue"]) < context["depth"]:
        try:
            context["queue"].append(next(context["it"]))
        except StopIteration:
            context["exhausted"] = True


def _receive(batches, context):
    """The loop receives the DataLoader's next batch: (its indices, the record `next_batch_info` gives, checked
    against them), or None when the new iterator's pass is empty (the iterator before it ended that pass)."""
    if context["it"] is None:
        _start_epoch(batches, context)
    if not context["queue"]:
        context.update(loop_epoch=context["loop_epoch"] + 1, in_epoch=False, it=None)
        return None
    received = context["queue"].pop(0)
    _fill(context)
    info = batches.next_batch_info()
    assert info.indices.tolist() == received
    context["batches"].append(info)
    if context["exhausted"] and not context["queue"]:  # the DataLoader's epoch ended
        context.update(loop_epoch=context["loop_epoch"] + 1, in_epoch=False, it=None)
    return received, info


def run_batch_sampler_op(batches, op, context, i, update_kind):
    import torch

    kind, seed = op
    r = np.random.default_rng([seed, i])
    if context["in_epoch"] and context["it"] is None:  # resumed mid-epoch: the epoch's iterator starts first
        _start_epoch(batches, context)
    if kind == "receive":
        got = _receive(batches, context)
        if got is None:
            return "empty pass"
        received, info = got
        out = [received, info.weights, info.epoch, info.step]
        if hasattr(batches, "choose"):  # a CandidateBatchSampler: the candidates scored, rows chosen
            out.append(_selection(batches.choose(info, torch.as_tensor(r.random(len(info)) * 2.0))))
        elif r.random() < 0.7:
            values = feedback_values(update_kind, r, len(info))
            if r.random() < 0.5:
                values = {key: torch.as_tensor(v) for key, v in values.items()}
            out.append(batches.feedback(info, **values))
        return out
    if kind == "end_epoch_early":  # e.g. Lightning's limit_train_batches: the loop drops the iterator
        if context["in_epoch"]:
            context.update(loop_epoch=context["loop_epoch"] + 1, in_epoch=False, it=None, queue=[])
        return None
    if kind == "feedback_older":
        return sampler_feedback(batches.sampler, update_kind, context, r)
    if kind == "read":
        return [len(batches), batches.sampler.stats()]
    raise AssertionError(kind)


BATCH_SAMPLER_OPS = ["receive", "receive", "receive", "receive", "end_epoch_early", "feedback_older", "read"]


@SETTINGS
@given(cfg=sampler_configs(updates=("loss", "loss_diff", "grad_bound_logits", "weight")),
       depth=st.integers(1, 4), ops_cut=_cut(_ops(BATCH_SAMPLER_OPS)), other=_ops(BATCH_SAMPLER_OPS, max_size=12),
       via=st.sampled_from(["copy", "file"]), candidates=st.sampled_from([None, "top_k", "selective_backprop"]))
def test_prioritized_batch_sampler_resumes_exactly(cfg, depth, ops_cut, other, via, candidates):
    """`PrioritizedBatchSampler`, or `CandidateBatchSampler` (its subclass with a selector) when ``candidates``."""
    pytest.importorskip("torch")
    from replayloader.torch import PrioritizedBatchSampler
    from replayloader.torch.candidates import CandidateBatchSampler

    if candidates and cfg["update"] not in ("loss", "loss_diff"):  # the scores are fed back as loss=
        cfg = {**cfg, "update": "loss"}
    ops, cut = ops_cut
    def make():
        if candidates:
            rule = TopK(1) if candidates == "top_k" else SelectiveBackprop(history=5)
            return CandidateBatchSampler(make_sampler(cfg), Selector(rule, seed=1))
        return PrioritizedBatchSampler(make_sampler(cfg))

    check_resume(make, lambda b, op, ctx, i: run_batch_sampler_op(b, op, ctx, i, cfg["update"]),
                 ops, cut, other, via, lambda: _loop_context(depth), resumed=_resumed_loop)


def test_set_epoch_after_resume_drops_batches_of_an_epoch_ended_early():
    pytest.importorskip("torch")
    from replayloader.torch import PrioritizedBatchSampler

    straight = PrioritizedBatchSampler(PrioritizedSampler(3, 1, seed=0))
    it = iter(straight)
    for _ in range(3):  # the DataLoader drew epoch 0's three batches ahead
        next(it)
    straight.next_batch_info(), straight.next_batch_info()  # the loop got two, then ended epoch 0 early
    state = straight.state_dict()  # an end-of-epoch checkpoint: epoch 0's third batch is pending
    resumed = PrioritizedBatchSampler(PrioritizedSampler(3, 1, seed=0))
    resumed.load_state_dict(state)
    streams = []
    for batches in (straight, resumed):
        batches.set_epoch(1)
        streams.append([(batches.next_batch_info().epoch, indices) for indices in iter(batches)])
    assert streams[0] == [(1, [2]), (1, [1]), (1, [0])]
    assert streams[1] == streams[0]  # before the fix: [(0, [1])], epoch 0's leftover batch, and epoch 1 ended there


# ------------------------------------------------------------------------------------------------ SB3 PER buffers
def make_sb3_buffer(cfg):
    from gymnasium import spaces
    from replayloader import sb3

    obs = spaces.Box(-1, 1, (2,)) if cfg["kind"] != "dict" else spaces.Dict(
        {"pos": spaces.Box(-1, 1, (2,)), "flag": spaces.Discrete(3)})
    cls = {"flat": sb3.PrioritizedReplayBuffer, "dict": sb3.PrioritizedDictReplayBuffer,
           "nstep": sb3.PrioritizedNStepReplayBuffer}[cfg["kind"]]
    extra = {"n_steps": 2, "gamma": 0.5} if cfg["kind"] == "nstep" else {}
    beta = {"default": None, "half": 0.5, "schedule": LinearSchedule(0.2, 1.0, 1)}[cfg["beta"]]
    return cls(cfg["buffer_size"], obs, spaces.Discrete(3), "cpu", n_envs=cfg["n_envs"],
               optimize_memory_usage=cfg["optimize"], handle_timeout_termination=cfg["timeouts"],
               alpha=cfg["alpha"], beta=beta, require_feedback=cfg["require_feedback"], seed=cfg["seed"], **extra)


def _numpy(value):
    if isinstance(value, dict):
        return {k: _numpy(v) for k, v in value.items()}
    return None if value is None else value.cpu().numpy() if hasattr(value, "cpu") else np.asarray(value)


def sb3_state(buffer):
    """Everything a pickle of the buffer holds, comparable (the generator by its state)."""
    state = dict(buffer.__getstate__())
    state["_rng"] = state["_rng"].bit_generator.state
    return state


def run_sb3_op(buffer, op, context, i, cfg):
    kind, seed = op
    r = np.random.default_rng([seed, i])
    n_envs = cfg["n_envs"]
    if kind == "add":
        def observation():
            if cfg["kind"] == "dict":
                return {"pos": r.uniform(-1, 1, (n_envs, 2)).astype(np.float32), "flag": r.integers(0, 3, n_envs)}
            return r.uniform(-1, 1, (n_envs, 2)).astype(np.float32)
        dones = r.random(n_envs) < 0.3
        infos = [{"TimeLimit.truncated": bool(d and r.random() < 0.5)} for d in dones]
        buffer.add(observation(), observation(), r.integers(0, 3, n_envs), r.random(n_envs), dones, infos)
        return None
    if kind in ("feedback", "feedback_again"):
        if not context["batches"]:
            return None
        indices = context["batches"][-1 - int(r.integers(0, min(len(context["batches"]), 3)))]
        form = r.choice(["all", "subset", "duplicates", "shuffled", "empty"])
        if form == "subset":
            indices = indices[r.random(len(indices)) < 0.5]
        elif form == "duplicates":
            indices = np.concatenate([indices, r.choice(indices, int(r.integers(1, len(indices) + 1)))])
        elif form == "shuffled":
            indices = r.permutation(indices)
        elif form == "empty":
            indices = indices[:0]
        for _ in range(2 if kind == "feedback_again" else 1):
            priorities = r.choice([0.0, 0.5, 2.0], len(indices)) if r.random() < 0.3 else r.random(len(indices)) * 3
            if r.random() < 0.5:
                buffer.update_priorities(indices, priorities)
            else:
                buffer.feedback(indices, priority=priorities)
        context["awaiting"] = False
        return [str(form), indices]
    if kind == "sample":
        if buffer.size() == 0 or (cfg["optimize"] and buffer.stored_slots() <= n_envs and buffer.full):
            return None
        if context["awaiting"]:  # the loop feeds the previous batch back before it samples again
            run_sb3_op(buffer, ("feedback", seed), {**context, "batches": context["batches"][-1:]}, i, cfg)
            context["awaiting"] = False
        batch = buffer.sample(int(r.integers(1, 6)))
        context["batches"].append(batch.indices)
        context["awaiting"] = cfg["require_feedback"]
        return [_numpy(field) for field in batch]
    if kind == "progress":
        buffer.progress = min(1.0, buffer.progress + float(r.random()) * 0.3)
        return buffer.current_beta()
    if kind == "read":
        return [buffer.priorities(), buffer.stored_slots(), buffer.size(), buffer.current_beta()]
    raise AssertionError(kind)


SB3_OPS = ["add", "add", "add", "sample", "sample", "feedback", "feedback_again", "progress", "read"]


@st.composite
def sb3_configs(draw):
    kind = draw(st.sampled_from(["flat", "flat", "dict", "nstep"]))
    optimize = kind == "flat" and draw(st.booleans())
    return {"kind": kind, "optimize": optimize, "buffer_size": draw(st.integers(2 if optimize else 1, 8)),
            "n_envs": draw(st.integers(1, 3)), "timeouts": draw(st.booleans()) and not optimize,
            "alpha": draw(st.sampled_from([0.0, 0.6, 1.0])), "beta": draw(st.sampled_from(["default", "half",
                                                                                          "schedule"])),
            "require_feedback": draw(st.booleans()), "seed": draw(st.integers(0, 3))}


@SETTINGS
@given(cfg=sb3_configs(), ops_cut=_cut(_ops(SB3_OPS)), via=st.sampled_from(["pickle", "save_to_pkl"]))
def test_sb3_buffer_resumes_exactly(cfg, ops_cut, via):
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.save_util import load_from_pkl, save_to_pkl

    ops, cut = ops_cut
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        straight, context = make_sb3_buffer(cfg), {"batches": [], "awaiting": False}
        for i, op in enumerate(ops[:cut]):
            run_sb3_op(straight, op, context, i, cfg)
        before = sb3_state(straight)
        if via == "pickle":
            loaded = pickle.loads(pickle.dumps(straight))
        else:  # what model.save_replay_buffer / load_replay_buffer do
            with tempfile.TemporaryDirectory() as folder:
                save_to_pkl(Path(folder) / "buffer", straight)
                loaded = load_from_pkl(Path(folder) / "buffer")
        assert_state_equal(before, sb3_state(straight), "the buffer, pickled")
        assert_state_equal(before, sb3_state(loaded), "the buffer, unpickled")
        at_cut = copy.deepcopy(context)
        tail = [run_sb3_op(straight, op, context, i, cfg) for i, op in enumerate(ops[cut:], cut)]
        again = [run_sb3_op(loaded, op, at_cut, i, cfg) for i, op in enumerate(ops[cut:], cut)]
        assert_state_equal(tail, again, "outputs after the load")
        assert_state_equal(sb3_state(straight), sb3_state(loaded), "final state")


# ------------------------------------------------------------------------------------------------ SelectionSwitch
def run_switch_op(switch, op, context, i):
    """One training step of a loop driven by a `SelectionSwitch` (docs: its module's loop), or only its first
    half (a step left open at the checkpoint, ended by the next op)."""
    kind, seed = op
    r = np.random.default_rng([seed, i])
    seconds = {"seconds": float(r.random())} if switch.cost == "seconds" else {}
    if switch.open_mode:  # the open step ends first
        if switch.open_indices is not None:
            switch.step_done(r.random(len(switch.open_indices)) * 2.0, **seconds)
        else:
            switch.step_done(**seconds)
        return ["ended", switch.stats()]
    if kind == "read":
        return [switch.selecting, switch.stats()]
    n_b, n = context["n_b"], context["n"]
    indices = r.integers(0, n, n_b)
    losses = r.random(n_b) * 2.0 - (0.5 if r.random() < 0.5 else 0.0)
    if switch.selecting or kind == "score_anyway":  # a uniform window may still score (SelectingTrainer, DDP)
        out = ["chosen", _selection(switch.choose(losses, indices, r.random(n_b) + 0.5))]
        if kind != "half_step" and (switch.cost == "seconds" or switch.open_mode):
            switch.step_done(**seconds)
    else:
        chosen = switch.uniform(indices if r.random() < 0.5 else _Drawn(indices, r.random(n_b) + 0.5))
        out = ["uniform", _selection(chosen)]
        if kind != "half_step":
            switch.step_done(r.random(len(chosen)) * 2.0, **seconds)
    return out + [switch.stats()]


class _Drawn:
    def __init__(self, indices, weights):
        self.indices, self.weights = indices, weights


@SETTINGS
@given(cfg=selection_configs(), window=st.integers(2, 4), probe_every=st.integers(3, 4),
       stop_at=st.sampled_from([None, 0.0, 0.5]), cost=st.sampled_from(["rows", "seconds"]),
       ops_cut=_cut(_ops(["step", "step", "step", "half_step", "score_anyway", "read"], max_size=60)),
       other=_ops(["step", "half_step"], max_size=10), via=st.sampled_from(["copy", "file"]))
def test_selection_switch_resumes_exactly(cfg, window, probe_every, stop_at, cost, ops_cut, other, via):
    from replayloader.selection import SelectionSwitch

    ops, cut = ops_cut
    n, n_b = cfg["sampler"]["n"], cfg["sampler"]["batch_size"]
    rule = cfg["rule"] if cfg["rule"] != "selective_backprop" else "top_k"
    cfg = {**cfg, "pool_steps": 0, "rule": rule}
    check_resume(lambda: SelectionSwitch(make_selector(cfg, n), window=window, probe_every=probe_every,
                                         stop_at=stop_at, cost=cost),
                 run_switch_op, ops, cut, other, via, lambda: {"n": n, "n_b": n_b})
