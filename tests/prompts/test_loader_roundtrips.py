"""Checkpoint round trips of the prompt loaders after legitimate use, by hypothesis: `GRPOPromptSampler` (TRL's
sampler, one process), `VerlPromptSampler` (verl's curriculum sampler, one process) and `DynamicSampling` (DAPO's
baseline). As in tests/core/test_checkpoint_roundtrips.py (whose helpers this reuses): a random sequence of
legitimate calls, cut at a random point; the ``state_dict`` goes through a deep copy or a state file
(`save_state` / `load_state`) into a fresh object of the same settings and into one of the same settings that
already made other calls; both must continue exactly as the uninterrupted object (every index handed out, every
feedback's result, every stats() read, the final state), with RuntimeWarnings raised as errors. The loaded state
is scribbled over after the load (an object must not keep the caller's arrays).

Legitimate use, as the docstrings, docs/prompts.md and tests/prompts/{scenario,test_torch,test_verl}.py drive it:

- `GRPOPromptSampler`: a trainer reading indices through a DataLoader that reads 0-6 indices ahead (within an
  epoch: a DataLoader iterator ends with its epoch), micro-batches of any size, feedback once per generation
  batch (its first B·G completions) for all its groups or a subset, groups in any order, completion level or
  group level, numpy or torch, ``policy_step`` given or not, the same batch fed twice (a re-generation), fed
  with lag, a new DataLoader iterator mid-epoch (its read-ahead lost), ``max_lag`` respected by feeding back
  before a draw it would refuse; checkpoints with ``state_dict(unconsumed=k)`` for the indices read ahead and
  lost (k at most the current chunk's offset), the trainer keeping the rest it had already received.
- `VerlPromptSampler`: built from verl's config lines, a loader taking B indices a step (and indices one by one,
  as a plain torch ``Sampler[int]``), ``update(batch)`` with DataProto-shaped batches (rows shuffled, scores per
  token or per response, a subset of groups), a new iterator mid-epoch. verl checkpoints before a step's update,
  and a resumed run forgets what awaited it (documented), so at the cut the uninterrupted run forgets it too
  (never updates those prompts); the batches it drew and had not updated still count as awaiting in it, so its
  ``lag`` counters are compared only when that count is the resumed one's.
- `DynamicSampling`: draws and their one feedback each (any order, either layout, numpy or torch), rounds until
  the batch is full or ``max_rounds``, cut between a draw and its feedback too.

Found here, and fixed: after exactly ``len()`` indices from one iterator that was not run on to its
StopIteration, a new iterator of `GRPOPromptSampler` (or `VerlPromptSampler`) yielded an empty pass, while one
loaded from the state_dict taken then started the next epoch at once; both now start the next epoch
(`test_a_new_iterator_after_an_epochs_last_index_starts_the_next_epoch`,
`test_verl_new_iterator_after_an_epochs_last_index_starts_the_next_epoch`).
"""
from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import assume, event, given, settings, strategies as st

torch = pytest.importorskip("torch")

from replayloader.prompts import (DynamicSampling, GRPOPromptSampler, Learnability, PromptSampler,  # noqa: E402
                                  RewardSpread, Uniform, VerlPromptSampler)

from ..core.test_checkpoint_roundtrips import _HUNT, SETTINGS, _cut, _long_ops, _ops, check_resume  # noqa: E402


PASS_RATE = np.array([0.0, 0.25, 0.5, 0.75, 1.0])


def group_rewards(r, prompts, g, rule):
    """One row of G rewards per prompt: 0/1 with the prompt's pass rate (some never, some always solved) for
    the binary rule, graded (ties included) for the others."""
    prompts = np.asarray(prompts, np.int64)
    if rule == "learnability":
        return (r.random((len(prompts), g)) < PASS_RATE[prompts % 5][:, None]).astype(np.float64)
    graded = r.choice([0.0, 0.5, 1.0], (len(prompts), g)) if r.random() < 0.5 else r.normal(size=(len(prompts), g))
    same = r.random(len(prompts)) < 0.3
    graded[same] = graded[same, :1]  # groups without spread
    return graded


RULES = {"learnability": Learnability, "reward_spread": RewardSpread, "uniform": Uniform}


@st.composite
def prompt_options(draw, n, b):
    """`PromptSampler` options (every feature: buckets, retests, staleness, retirement, exploration)."""
    return {"rule": draw(st.sampled_from(sorted(RULES))), "labels": draw(st.sampled_from([None, 2, 3])),
            "exploration": draw(st.sampled_from([0.0, 0.1, 1.0])), "prior_strength": draw(st.sampled_from([0.5, 2.0])),
            "prior_memory": draw(st.sampled_from([0.0, 0.9])), "retest_every": draw(st.sampled_from([None, 1, 3])),
            "retest_size": draw(st.integers(1, b)), "stale_after": draw(st.sampled_from([None, 1, 3])),
            "retire_after": draw(st.sampled_from([None, 2, 4])) if n >= 3 * b else None,
            "seed": draw(st.integers(0, 3))}


def make_prompts(n, b, g, options):
    labels = None if options["labels"] is None else np.arange(n) % options["labels"]
    return PromptSampler(n, b, group_size=g, rule=RULES[options["rule"]](), labels=labels,
                         **{k: v for k, v in options.items() if k not in ("rule", "labels")})


def active(prompts):
    return int((~prompts.retired).sum())


# ------------------------------------------------------------------------------------------------ GRPOPromptSampler
def grpo_context(depth):
    """A trainer over a DataLoader reading ``depth`` indices ahead: ``queue`` read ahead, not received;
    ``received`` every index the trainer received, by stream position (None: read ahead and lost with an
    iterator); ``fed``: the chunks (generation batches) fed back."""
    return {"it": None, "exhausted": False, "queue": [], "depth": depth, "received": [], "fed": set()}


def _needs_draw(s):
    return s.batch is None or s.offset >= s.chunk_length


def _can_pull(s):
    """Whether the next index can be read without a draw `max_lag` refuses (the trainer feeds back first)."""
    waiting = s.counters["chunks_drawn"] - s.counters["feedback_calls"]
    return s.max_lag is None or not _needs_draw(s) or waiting <= s.max_lag


def _pull(s, context):
    """One index from the DataLoader iterator into the read-ahead; False when it cannot (epoch ended: the
    iterator is exhausted; or max_lag)."""
    if context["exhausted"] or not _can_pull(s) or (_needs_draw(s) and active(s.prompts) < s.prompts.batch_size):
        return False  # (too few active prompts for a batch: a documented RuntimeError, the run stops drawing)
    if context["it"] is None:
        context["it"] = iter(s)
    try:
        context["queue"].append(next(context["it"]))
        return True
    except StopIteration:
        context.update(exhausted=True, it=None)
        return False


def _fill(s, context):
    while len(context["queue"]) < context["depth"] and _pull(s, context):
        pass


def _receive_one(s, context):
    while not context["queue"]:
        if context["exhausted"]:  # the epoch's DataLoader iterator ended: the trainer's next epoch
            context.update(exhausted=False, it=None)
        if not _pull(s, context) and not context["exhausted"]:
            return None
    index = context["queue"].pop(0)
    context["received"].append(index)
    _fill(s, context)
    return index


def _oldest_feedable(s, context):
    """The oldest chunk not fed back whose first B·G completions the trainer received."""
    cl, bg = s.chunk_length, s.prompts.batch_size * s.num_generations
    c = 0
    while c * cl + bg <= len(context["received"]):
        if c not in context["fed"]:
            return c
        c += 1
    return None


def grpo_feedback(s, context, r, rule, chunk, times=1):
    """One generation batch's rewards, in one of its legitimate forms (its complete groups; all or a subset, in
    any order, either layout, numpy or torch, with or without policy_step)."""
    g, b, cl = s.num_generations, s.prompts.batch_size, s.chunk_length
    context["fed"].add(chunk)
    received = context["received"][chunk * cl:chunk * cl + b * g]
    groups = [received[j * g] for j in range(b) if None not in received[j * g:(j + 1) * g]]
    if not groups:
        return "no complete group"
    form = str(r.choice(["all", "all", "subset", "shuffled"]))
    if form == "subset":
        keep = r.random(len(groups)) < 0.5
        groups = [p for p, k in zip(groups, keep) if k] or groups[:1]
    elif form == "shuffled":
        groups = [groups[j] for j in r.permutation(len(groups))]
    out = [form]
    for _ in range(times):  # times=2: the same batch generated again (counted as new groups, documented)
        rewards = group_rewards(r, groups, g, rule)
        indices = np.asarray(groups, np.int64)
        if r.random() < 0.5:  # TRL's layout: one index and one reward per completion
            indices, rewards = np.repeat(indices, g), rewards.reshape(-1)
        if r.random() < 0.5:
            indices, rewards = torch.as_tensor(indices), torch.as_tensor(rewards, dtype=torch.float32)
        policy_step = None if r.random() < 0.5 else s.prompts.clock + int(r.integers(0, 3))
        out.append(s.feedback(indices, rewards=rewards, policy_step=policy_step))
    return out + [s.stats()]


def run_grpo_op(s, op, context, i, rule):
    kind, seed = op
    r = np.random.default_rng([seed, i])
    _fill(s, context)  # a resumed trainer's new iterator reads ahead first
    if kind == "receive":  # a micro-batch
        got = []
        for _ in range(int(r.integers(1, s.prompts.batch_size * s.num_generations + 1))):
            index = _receive_one(s, context)
            if index is None:  # blocked by max_lag: the trainer feeds back what it can, then goes on
                chunk = _oldest_feedable(s, context)
                if chunk is None:
                    break
                got.append(grpo_feedback(s, context, r, rule, chunk))
                index = _receive_one(s, context)
                if index is None:
                    break
            got.append(index)
        return got
    if kind in ("feedback", "feedback_again"):
        chunk = _oldest_feedable(s, context)
        if chunk is None:
            return None
        return grpo_feedback(s, context, r, rule, chunk, times=2 if kind == "feedback_again" else 1)
    if kind == "new_iterator":  # a new DataLoader iterator mid-epoch: what the old one read ahead is lost
        context["received"].extend([None] * len(context["queue"]))
        context.update(queue=[], it=None, exhausted=False)
        _fill(s, context)
        return None
    if kind == "read":
        return [len(s), s.yielded, s.stats(), s.prompts.probabilities()]
    raise AssertionError(kind)


def grpo_checkpoint(pick):
    """``state_dict(unconsumed=k)``: the last k indices read ahead (at most the current chunk's offset) are
    handed out again; the trainer keeps the indices it had read before them."""
    def checkpoint(s, context):
        offset = s.offset if s.batch is not None else 0
        k = pick % (min(len(context["queue"]), offset) + 1)
        state = s.state_dict(unconsumed=k)
        event(f"cut: read-ahead {bool(context['queue'])}, unconsumed {k > 0}, mid-chunk {0 < offset < s.chunk_length}"
              f", epoch {min(s.epoch, 1)}+, fed {min(len(context['fed']), 2)}+")
        kept = context["queue"][:len(context["queue"]) - k]
        # the epoch was read to its end by a live DataLoader iterator: its next read ends it (the trainer starts
        # the next epoch when it asks for an index once the last ones are received), as it ended in the
        # uninterrupted run; not so after a new iterator (which starts the next epoch at once)
        epoch_done = _needs_draw(s) and s.chunk == s.num_batches and k == 0 and context["it"] is not None
        resumed = {**copy.deepcopy({**context, "it": None}), "queue": kept,
                   "exhausted": context["exhausted"] or epoch_done}
        return state, resumed
    return checkpoint


GRPO_OPS = ["receive", "receive", "receive", "receive", "feedback", "feedback", "feedback_again", "new_iterator",
            "read"]


@st.composite
def grpo_configs(draw):
    b = draw(st.integers(1, 4))
    n = draw(st.integers(b, 14))
    return {"n": n, "b": b, "g": draw(st.integers(2, 4)), "repeat": draw(st.integers(1, 3)),
            "num_batches": draw(st.sampled_from([None, 1, 2, 3])), "max_lag": draw(st.sampled_from([None, 0, 1, 2])),
            "prompts": draw(prompt_options(n, b))}


def make_grpo(cfg):
    return GRPOPromptSampler(make_prompts(cfg["n"], cfg["b"], cfg["g"], cfg["prompts"]), num_generations=cfg["g"],
                             repeat_count=cfg["repeat"], num_batches=cfg["num_batches"], max_lag=cfg["max_lag"])


@settings(SETTINGS, max_examples=_HUNT or 1000)  # fast: a few ms an example
@given(cfg=grpo_configs(), depth=st.integers(0, 6), ops_cut=_cut(_long_ops(GRPO_OPS)),
       other=_ops(GRPO_OPS, max_size=12), pick=st.integers(0, 100), via=st.sampled_from(["copy", "file"]))
def test_grpo_prompt_sampler_resumes_exactly(cfg, depth, ops_cut, other, pick, via):
    ops, cut = ops_cut
    check_resume(lambda: make_grpo(cfg), lambda s, op, ctx, i: run_grpo_op(s, op, ctx, i, cfg["prompts"]["rule"]),
                 ops, cut, other, via, lambda: grpo_context(depth), checkpoint=grpo_checkpoint(pick), settle=_fill)


def _an_epoch_then_two_passes(make):
    """Exactly ``len()`` indices from one iterator (not run on to its StopIteration, as ``zip(range(len(s)), s)``
    or a trainer that counts its steps leaves it), then two new iterators: uninterrupted, and resumed from the
    state taken after that epoch."""
    straight = make()
    it = iter(straight)
    for _ in range(len(straight)):
        next(it)
    resumed = make()
    resumed.load_state_dict(copy.deepcopy(straight.state_dict()))
    return [[list(iter(sampler)) for _ in range(2)] for sampler in (straight, resumed)]


def test_a_new_iterator_after_an_epochs_last_index_starts_the_next_epoch():
    """After exactly len() indices from one iterator (not run on to its StopIteration), a new iterator starts
    the next epoch, as a sampler resumed from the state taken then does (it yielded an empty pass before)."""
    straight, resumed = _an_epoch_then_two_passes(
        lambda: GRPOPromptSampler(PromptSampler(4, 2, group_size=2, seed=0), num_generations=2, max_lag=None))
    assert [len(p) for p in straight] == [8, 8]
    assert resumed == straight


# ------------------------------------------------------------------------------------------------ VerlPromptSampler
def verl_context():
    """verl's loop: ``it`` the loader's iterator over the sampler; ``received`` every index by stream position;
    ``unfed`` the stream positions handed out and not updated yet; ``awaiting`` the batches drawn since the last
    update, as the loop counts them."""
    return {"it": None, "received": [], "unfed": [], "awaiting": 0}


def _verl_take(s, context, k):
    """``k`` indices from the loader's iterator (a new one, the next epoch, when it ended)."""
    got = []
    while len(got) < k:
        draw = s.batch is None or s.offset == len(s.batch)
        if draw and s.max_lag is not None and context["awaiting"] > s.max_lag:
            break  # a draw max_lag refuses: the loop updates first
        if draw and active(s.prompts) < s.prompts.batch_size:
            break  # retirement left too few prompts for a batch (documented RuntimeError): the run stops drawing
        if context["it"] is None:
            context["it"] = iter(s)
        try:
            index = next(context["it"])
        except StopIteration:
            context["it"] = None
            continue
        context["awaiting"] += draw
        context["unfed"].append(len(context["received"]))
        context["received"].append(index)
        got.append(index)
    return got


def verl_update(s, context, r, rule, g):
    """``update(batch)`` for the prompts handed out since the last one (a DataProto: ``g`` responses a prompt,
    rows shuffled, scores per token or per response; all groups or a subset)."""
    prompts = list(dict.fromkeys(context["received"][p] for p in context["unfed"]))  # a prompt's group once
    context.update(unfed=[], awaiting=0)
    if not prompts:
        return None
    if r.random() < 0.2:  # e.g. groups filtered out before the update
        keep = r.random(len(prompts)) < 0.5
        prompts = [p for p, k in zip(prompts, keep) if k] or prompts[:1]
    rewards = group_rewards(r, prompts, g, rule).reshape(-1)
    index = np.repeat(np.asarray(prompts), g)
    uid = np.repeat([f"uid-{p}-{r.integers(1 << 30)}" for p in prompts], g)
    order = r.permutation(len(index))
    if r.random() < 0.5:
        scores = torch.zeros(len(index), 3, dtype=torch.float64)
        scores[:, -1] = torch.as_tensor(rewards)
    else:
        scores = torch.as_tensor(rewards)
    s.update(SimpleNamespace(batch={"token_level_scores": scores[order]},
                             non_tensor_batch={"index": index[order].astype(object), "uid": uid[order].astype(object)}))
    return [prompts, s.stats()]


def run_verl_op(s, op, context, i, rule, g):
    kind, seed = op
    r = np.random.default_rng([seed, i])
    if kind == "step":  # the loader's batch of B prompts, then (usually) the step's update
        got = _verl_take(s, context, s.prompts.batch_size)
        return [got, verl_update(s, context, r, rule, g) if r.random() < 0.8 else None]
    if kind == "fetch":  # a few indices, the sampler read as a plain Sampler[int]
        return _verl_take(s, context, int(r.integers(1, s.prompts.batch_size + 1)))
    if kind == "update":
        return verl_update(s, context, r, rule, g)
    if kind == "new_iterator":
        context["it"] = None
        return None
    if kind == "read":
        return [len(s), s.stats()]
    raise AssertionError(kind)


def verl_checkpoint(s, context):
    """verl saves before the step's update and a resumed run forgets what awaited it: so does the uninterrupted
    run here (it never updates those prompts). The current batch's indices handed out stay awaited in both."""
    state = s.state_dict()
    b = s.prompts.batch_size
    mid = s.batch is not None and s.offset < len(s.batch)
    current = len(context["received"]) // b if mid else None  # stream positions of a batch are b aligned
    forgotten = sum(p // b != current for p in context["unfed"])
    event(f"cut: mid-batch {mid}, forgotten {min(forgotten, 2)}+"
          f", epoch {min(s.epoch, 1)}+, updates {min(s.counters['updates'], 2)}+")
    exact = context["awaiting"] == int(mid)  # what load_state_dict sets: then the lag counters must match too
    context.update(unfed=[p for p in context["unfed"] if p // b == current], awaiting=int(mid))
    return state, {**copy.deepcopy({**context, "it": None}), "exact": exact}


UNBOUNDED = 1000  # data.sampler.max_lag: None (or left out) means the default, 1
VERL_OPS = ["step", "step", "step", "step", "fetch", "update", "new_iterator", "read"]


def _without_lag(node):
    """The outputs and states without the verl sampler's lag counters (see the module doc)."""
    if isinstance(node, dict):
        return {k: _without_lag(v) for k, v in node.items() if k not in ("lag", "max_lag_seen")}
    if isinstance(node, (list, tuple)):
        return [_without_lag(v) for v in node]
    return node


@st.composite
def verl_configs(draw):
    b = draw(st.integers(1, 4))
    n = draw(st.integers(b, 14))
    options = draw(prompt_options(n, b))
    sampler = {"rule": options["rule"], "exploration": options["exploration"],
               "prior_strength": options["prior_strength"], "retest_every": options["retest_every"],
               "retest_size": options["retest_size"], "stale_after": options["stale_after"],
               "retire_after": options["retire_after"], "max_lag": draw(st.sampled_from([None, 0, 3, UNBOUNDED])),
               "class_path": "pkg://replayloader.prompts.verl", "class_name": "VerlPromptSampler"}
    return {"n": n, "g": draw(st.integers(2, 4)),
            "data": {"train_batch_size": b, "gen_batch_size": None, "seed": options["seed"],
                     "dataloader_num_workers": 0, "sampler": {k: v for k, v in sampler.items() if v is not None}}}


@settings(SETTINGS, max_examples=_HUNT or 1000)  # fast: a few ms an example
@given(cfg=verl_configs(), ops_cut=_cut(_long_ops(VERL_OPS)), other=_ops(VERL_OPS, max_size=12),
       via=st.sampled_from(["copy", "file"]))
def test_verl_prompt_sampler_resumes_exactly(cfg, ops_cut, other, via):
    ops, cut = ops_cut
    rule = cfg["data"]["sampler"]["rule"]
    exact = {}

    def checkpoint(s, context):
        state, resumed = verl_checkpoint(s, context)
        exact["yes"] = resumed.pop("exact")
        # Not comparable: batches the uninterrupted run drew and will never update still count against its
        # max_lag (they await feedback in it), not in the resumed run, so it stops drawing where that one goes on
        assume(exact["yes"] or s.max_lag >= UNBOUNDED)
        return state, resumed

    check_resume(lambda: VerlPromptSampler(range(cfg["n"]), copy.deepcopy(cfg["data"])),
                 lambda s, op, ctx, i: run_verl_op(s, op, ctx, i, rule, cfg["g"]), ops, cut, other, via,
                 verl_context, checkpoint=checkpoint, comparable=lambda x: x if exact["yes"] else _without_lag(x))


def test_verl_new_iterator_after_an_epochs_last_index_starts_the_next_epoch():
    straight, resumed = _an_epoch_then_two_passes(
        lambda: VerlPromptSampler(range(4), {"train_batch_size": 2, "sampler": {"max_lag": UNBOUNDED}}))
    assert [len(p) for p in straight] == [4, 4]
    assert resumed == straight


# ------------------------------------------------------------------------------------------------ DynamicSampling
def run_dynamic_op(d, op, context, i, g):
    kind, seed = op
    r = np.random.default_rng([seed, i])
    if kind == "draw":
        if d.pending is not None:  # the loop feeds the last draw back before it draws again
            run_dynamic_op(d, ("feedback", seed), context, i, g)
        batch = d.next_batch()
        return [batch.indices, batch.step, d.full, d.need, d.stats()]
    if kind == "feedback":
        if d.pending is None:
            return None
        prompts = r.permutation(d.pending) if r.random() < 0.5 else d.pending.copy()
        rewards = group_rewards(r, prompts, g, "learnability" if r.random() < 0.5 else "graded")
        indices = prompts
        if r.random() < 0.5:  # one index and one reward per completion
            indices, rewards = np.repeat(prompts, g), rewards.reshape(-1)
        if r.random() < 0.5:
            indices, rewards = torch.as_tensor(indices), torch.as_tensor(rewards)
        return [d.feedback(indices, rewards=rewards), d.full, d.need, d.kept]
    if kind == "read":
        return [d.stats(), d.full, d.need]
    raise AssertionError(kind)


@SETTINGS
@given(n=st.integers(1, 20), b=st.integers(1, 6), oversample=st.sampled_from([1.0, 1.3, 2.0, 3.0]),
       max_rounds=st.sampled_from([None, 1, 2]), g=st.integers(2, 4), seed=st.integers(0, 3),
       ops_cut=_cut(_long_ops(["draw", "draw", "feedback", "feedback", "read"])),
       other=_ops(["draw", "feedback"], max_size=10), via=st.sampled_from(["copy", "file"]))
def test_dynamic_sampling_resumes_exactly(n, b, oversample, max_rounds, g, seed, ops_cut, other, via):
    if math.ceil(b * oversample) > n:  # refused by the constructor: a draw's prompts are distinct
        b, oversample = min(b, n), 1.0
    ops, cut = ops_cut

    def make():
        return DynamicSampling(n, b, oversample=oversample, max_rounds=max_rounds, group_size=g, seed=seed)

    check_resume(make, lambda d, op, ctx, i: run_dynamic_op(d, op, ctx, i, g), ops, cut, other, via, dict,
                 checkpoint=lambda d, ctx: (event(f"cut: awaiting feedback {d.pending is not None}, "
                                                  f"batches {min(d.step, 3)}+")
                                 or d.state_dict(), copy.deepcopy(ctx)))
