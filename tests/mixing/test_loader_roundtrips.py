"""Checkpoint round trips of `MixtureBatchSampler` (a `MixtureSampler` in a DataLoader, one process) after
legitimate use, by hypothesis, with the harness of tests/core/test_checkpoint_roundtrips.py: a random sequence
of legitimate calls, cut at a random point; the ``state_dict`` goes through a deep copy or a state file
(`save_state` / `load_state`) into a fresh batch sampler of the same settings and into one that already made
other calls; both must continue exactly as the uninterrupted one (every batch, its sources, mixture and step,
every stats() read, the final state), with RuntimeWarnings raised as errors.

Legitimate use (docs/mixing.md, the module and class docstrings): a DataLoader's prefetch (simulated in one
process: ``iter()`` drawing 1-4 index lists ahead of the loop), `next_batch_info` once per batch received,
feedback for it or for an older batch received (the `MixtureBatch`, its indices as numpy, a list or a torch
tensor, a subset, with duplicates, shuffled, twice; losses numpy or torch), epochs (passes) ended early as
Lightning's ``limit_train_batches`` does, ``set_epoch`` at each epoch start, a new DataLoader iterator in the
middle of a pass; ``within="uniform"`` and ``"prioritized"``, rules FixedMixture, ODM, ODMExp3, ExcessLoss, ADO;
``num_batches`` set or not.

Found here, and fixed (each pinned by a test below):

- a checkpoint taken while the DataLoader had drawn a pass to its end and the loop had not yet received its
  last batches (a real 2-worker DataLoader does so in the last ``num_workers × prefetch_factor`` batches of
  every pass) could not be loaded: its ``position`` was negative
  (`test_a_checkpoint_after_the_pass_was_drawn_to_its_end_loads_and_resumes`);
- a checkpoint taken after the loop ended a pass early while the DataLoader still held batches it had drawn
  ahead (an end-of-epoch checkpoint, as Lightning takes it) resumed with those batches, which the uninterrupted
  run drops when its next iterator starts (`test_a_pass_ended_early_drops_its_prefetched_batches_after_a_resume`).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, settings, strategies as st

torch = pytest.importorskip("torch")

from replayloader.mixing import ADO, ODM, ExcessLoss, FixedMixture, MixtureSampler, ODMExp3  # noqa: E402
from replayloader.torch import MixtureBatchSampler  # noqa: E402

from ..core.test_checkpoint_roundtrips import (_HUNT, SETTINGS, _cut, _fill, _long_ops, _loop_context,  # noqa: E402
                                               _ops, _receive, _resumed_loop, _start_epoch, check_resume)


RULES = ["fixed", "stratified", "natural", "odm", "odm_exp3", "excess", "ado"]


def make_rule(cfg):
    k, rule, r = len(cfg["sizes"]), cfg["rule"], np.random.default_rng(cfg["rule_seed"])
    if rule == "fixed":
        p = r.random(k) * (r.random(k) < 0.8) + 1e-3 * (np.arange(k) == 0)
        return FixedMixture(p / p.sum())
    if rule == "stratified":
        return FixedMixture.stratified(k)
    if rule == "natural":
        return FixedMixture.natural(cfg["sizes"])
    if rule == "odm":
        return ODM(warmup_steps=cfg["warmup"], smoothing=[0.0, 0.5, 0.9][cfg["rule_seed"] % 3],
                   initial=None if cfg["rule_seed"] % 2 else np.asarray(cfg["sizes"]) / sum(cfg["sizes"]))
    if rule == "odm_exp3":
        return ODMExp3(warmup_steps=cfg["warmup"], correction=["presence", "probability"][cfg["rule_seed"] % 2])
    if rule == "excess":
        return ExcessLoss(r.random(k) * 2.0, step_size=[0.1, 1.0, 5.0][cfg["rule_seed"] % 3],
                          smoothing=[0.0, 1e-3, 0.2][cfg["rule_seed"] % 3])
    if rule == "ado":  # the schedule of a short run: a fit every 5 feedback steps from step 2 on
        return ADO(step_scale=0.005, min_weight=[0.0, 0.01][cfg["rule_seed"] % 2] / k)
    raise AssertionError(rule)


def make_mixture(cfg):
    prioritized = None
    if cfg["within"] == "prioritized":
        prioritized = {"alpha": cfg["alpha"], "uniform_fraction": cfg["uniform_fraction"],
                       "warmup_epochs": cfg["warmup_epochs"]}
    sampler = MixtureSampler(cfg["sizes"], batch_size=cfg["batch_size"], rule=make_rule(cfg), seed=cfg["seed"],
                             within=cfg["within"], prioritized=prioritized)
    return MixtureBatchSampler(sampler, num_batches=cfg["num_batches"])


@st.composite
def mixture_configs(draw, rules=tuple(RULES)):
    k = draw(st.integers(1, 4))
    return {"sizes": draw(st.lists(st.integers(1, 8), min_size=k, max_size=k)),
            "batch_size": draw(st.integers(1, 6)), "rule": draw(st.sampled_from(rules)),
            "rule_seed": draw(st.integers(0, 5)), "warmup": draw(st.integers(0, 3)),
            "within": draw(st.sampled_from(["uniform", "prioritized"])),
            "alpha": draw(st.sampled_from([0.0, 1.0])), "uniform_fraction": draw(st.sampled_from([0.0, 0.3])),
            "warmup_epochs": draw(st.integers(0, 1)),
            "num_batches": draw(st.sampled_from([None, 1, 2, 5])), "seed": draw(st.integers(0, 3))}


def _losses(r, k, rule):
    values = r.random(k) * 4.0 + 0.05
    if rule != "ado" and r.random() < 0.3:  # ADO fits log losses: a seen source's loss must be > 0
        values = r.choice([0.0, 0.5, 1.0, 3.0], k)
    return values


def mixture_feedback(batches, info, r, rule):
    """Feedback for a received batch in one of its legitimate forms; returns the form and the stats after."""
    form = str(r.choice(["batch", "indices", "list", "torch", "subset", "duplicates", "shuffled"]))
    target = info
    if form == "indices":
        target = info.indices.copy()
    elif form == "list":
        target = info.indices.tolist()
    elif form == "torch":
        target = torch.as_tensor(info.indices)
    elif form == "subset":
        target = info.indices[r.random(len(info)) < 0.5]
        target = target if len(target) else info.indices[:1]
    elif form == "duplicates":
        target = np.concatenate([info.indices, r.choice(info.indices, int(r.integers(1, len(info) + 1)))])
    elif form == "shuffled":
        target = r.permutation(info.indices)
    k = len(info) if form == "batch" else len(target)
    loss = _losses(r, k, rule)
    if r.random() < 0.5:
        loss = torch.as_tensor(loss, dtype=torch.float32 if r.random() < 0.5 else torch.float64)
    batches.feedback(target, loss=loss)
    return [form, batches.stats()]


def run_mixture_op(batches, op, context, i, rule):
    kind, seed = op
    r = np.random.default_rng([seed, i])
    if context["in_epoch"] and context["it"] is None:  # resumed mid-epoch: the epoch's iterator starts first
        _start_epoch(batches, context)
    if kind == "receive":
        got = _receive(batches, context)
        if got is None:
            return "empty pass"
        received, info = got
        out = [received, info.sources, info.mixture, info.step]
        if r.random() < 0.7:
            out.append(mixture_feedback(batches, info, r, rule))
        return out
    if kind == "feedback_again":  # the last batch received, fed back a second time
        if not context["batches"]:
            return None
        return [mixture_feedback(batches, context["batches"][-1], r, rule) for _ in range(2)]
    if kind == "feedback_older":
        if not context["batches"]:
            return None
        info = context["batches"][-1 - int(r.integers(0, min(len(context["batches"]), 5)))]
        return mixture_feedback(batches, info, r, rule)
    if kind == "end_epoch_early":  # e.g. Lightning's limit_train_batches: the loop drops the iterator
        if context["in_epoch"]:
            context.update(loop_epoch=context["loop_epoch"] + 1, in_epoch=False, it=None, queue=[])
        return None
    if kind == "new_iterator":  # the loop makes a new DataLoader iterator mid-epoch (its prefetch is dropped)
        if context["in_epoch"]:
            context.update(it=iter(batches), queue=[], exhausted=False)
            _fill(context)
        return None
    if kind == "read":
        return [len(batches), batches.stats(), batches.mixture.probabilities()]
    raise AssertionError(kind)


MIXTURE_OPS = ["receive", "receive", "receive", "receive", "feedback_again", "feedback_older", "end_epoch_early",
               "new_iterator", "read"]


def _resumed_mixture_loop(context):
    """As `_resumed_loop`, with a note of where the cut fell."""
    event(f"cut: pending {min(len(context['queue']), 2)}+, in epoch {context['in_epoch']}, "
          f"epoch {min(context['loop_epoch'], 1)}+, received {min(len(context['batches']), 3)}+")
    return _resumed_loop(context)


@settings(SETTINGS, max_examples=_HUNT or 200)  # (ADO's fits make some examples slow: ~30 s in all)
@given(cfg=mixture_configs(), depth=st.integers(1, 4), ops_cut=_cut(_long_ops(MIXTURE_OPS)),
       other=_ops(MIXTURE_OPS, max_size=12), via=st.sampled_from(["copy", "file"]))
def test_mixture_batch_sampler_resumes_exactly(cfg, depth, ops_cut, other, via):
    ops, cut = ops_cut
    check_resume(lambda: make_mixture(cfg),
                 lambda b, op, ctx, i: run_mixture_op(b, op, ctx, i, cfg["rule"]),
                 ops, cut, other, via, lambda: _loop_context(depth), resumed=_resumed_mixture_loop)


def test_a_pass_ended_early_drops_its_prefetched_batches_after_a_resume():
    def make():
        return MixtureBatchSampler(MixtureSampler([3], batch_size=1, rule=FixedMixture([1.0]), seed=0))

    straight = make()
    it = iter(straight)
    next(it), next(it)  # the DataLoader drew two batches ahead
    straight.next_batch_info()  # the loop received one, then ended the epoch early
    state = straight.state_dict()  # an end-of-epoch checkpoint: the second batch is pending
    resumed = make()
    resumed.load_state_dict(state)
    streams = []
    for batches in (straight, resumed):
        batches.set_epoch(1)
        streams.append(list(iter(batches)))
    assert streams[0] == [[1]]
    assert streams[1] == streams[0]  # before the fix: [[2], [1]], the batch drawn ahead of the ended epoch came back


def test_a_checkpoint_after_the_pass_was_drawn_to_its_end_loads_and_resumes():
    def make():
        return MixtureBatchSampler(MixtureSampler([2], batch_size=1, rule=FixedMixture([1.0]), seed=0))

    straight = make()
    it = iter(straight)
    assert [next(it), next(it), next(it, "end")] == [[0], [1], "end"]  # the DataLoader drew the pass to its end
    straight.next_batch_info()  # the loop received the first batch
    state = straight.state_dict()  # the second batch is pending
    resumed = make()
    resumed.load_state_dict(state)  # before the fix: InvalidState, position -1
    assert list(iter(resumed)) == [[1]]  # the pending batch ends the pass, as the straight loop receives it
    assert list(iter(resumed)) == list(iter(straight))  # then both draw the next pass
