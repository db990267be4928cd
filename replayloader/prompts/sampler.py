"""PromptSampler: prompts for RL post-training (GRPO, DAPO, RLOO) drawn by learnability, from free rollout rewards.

Why: with group-relative advantages a prompt whose G completions all get the same reward (all solved or all
failed) gives zero advantage and zero gradient, yet its rollouts are the most expensive part of the step. The
rollouts already scored every completion, so each prompt's record costs nothing to keep.

**The record** (per prompt): its groups, attempts (completions), successes (the sum of its rewards: successes
for 0/1 rewards), the sum of its groups' *signals* (the rule's value of each group: `rules`), the policy step it
was last measured at, its run of solved groups, and whether it is retired.

**The priority** of prompt i in bucket b (one bucket without ``labels``), with m = ``prior_strength``::

    priority_i = (d·S_i + m·prior_b) / (d·g_i + m)

the mean of its groups' signals S_i / g_i, shrunk toward the prior as if m groups of the prior had been seen
(so a prompt seen once is not trusted like one seen ten times). ``prior_b`` is ``prior`` (default: the rule's
``default_prior``); with ``labels`` it is the running mean of the signals of bucket b's groups (an exponential
mean with ``prior_memory`` per feedback call; ``prior`` until the bucket has a group). d = 1, or with
``stale_after=N`` d = 2^-⌊age/N⌋ for a record ``age`` policy steps old (0 after 30 halvings: forgotten), so an
old measurement decays toward the prior instead of steering draws forever while the policy moves on.

**A draw** (`next_batch`, `sample`): the batch's prompts are distinct; each is drawn from what is left with

    P(i) = (1 − ε)·priority_i / Σ_j priority_j + ε / (active prompts)

(ε = ``exploration``: a floor, so no active prompt is ever unreachable; all uniform while every priority is 0).
Around it: every ``retest_every`` batches, the first ``retest_size`` places go to *retests*: prompts judged
solved or unsolved (measured, and every measured group had zero signal), the longest untested first, since the
policy may have changed what they would give; a prompt solved in ``retire_after`` groups in a row is *retired*
(never drawn again).

**How it stays O(log N)**: a priority is ``A_i + c_i·prior_b`` with A_i = d·S_i / (d·g_i + m) and
c_i = m / (d·g_i + m), and neither A_i nor c_i depends on the prior. So the sampler keeps one sum tree over the
A_i, one per bucket over the c_i and one over the active prompts (with the retest queue as its min keys)
(`trees`), and, with ``stale_after``, a calendar of the steps the records were measured at, which says which
records halve at a feedback call (`staleness`). A draw picks a tree by its mass (a bucket's is prior_b × its
sum) and descends it; a bucket's prior can change every step without touching a leaf; a feedback call rewrites
only the leaves of the prompts it measured and of the records that decayed since the last call. A batch's draws
and a feedback call's writes each run in one compiled kernel (`kernels.prompts`): O(B log N) for a batch of B
prompts, plus a leaf write per record that halved, and nothing of length N.

A drawn batch's leaves are rewritten with the next feedback call's writes, at that call's clock: the values are
those of the draw's clock, because a leaf depends on the clock only through its record's halvings, and a record
that halved in between is rewritten at the new clock anyway. Anything else that reads the trees brings them up
to date first. So the draws and records are those of writing every leaf at once, bit for bit.

**The clock** is the policy step: each feedback call advances it by 1 (one generation), or to ``policy_step=``
when given (e.g. the trainer's global step). Ages and retests count policy steps.

Every random number comes from the sampler's own generator (two uniforms per drawn place), whose state is
checkpointed with the records: `state_dict` / `load_state_dict` continue the identical stream.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _checks as checks
from ..kernels import prompts as kernels
from ..kernels.rng import seed_state
from ..state.atomic import sha256_bytes
from ..state.checks import array, check_header, counters, finite_nonnegative, integer, number, require, rng_words
from .groups import read_groups
from .rules import Learnability, PriorityRule
from .staleness import DecayCalendar
from .trees import PromptTrees

STATE_VERSION = 1


@dataclass(frozen=True, eq=False)
class PromptBatch:
    """One batch of distinct prompt ``indices`` (int64); ``retest`` marks those drawn as retests of a judged
    prompt; ``step`` is the number of batches drawn before this one and ``policy_step`` the sampler's clock when
    it was drawn (the policy its rollouts come from)."""

    indices: np.ndarray
    retest: np.ndarray
    step: int
    policy_step: int

    def __len__(self) -> int:
        return len(self.indices)

    @staticmethod
    def fields(batch: PromptBatch | None) -> dict[str, Any]:
        """The state fields of the batch a loader is handing out (``None``: between batches), as the torch and
        verl samplers save them; `read_fields` reads them back."""
        return {"batch_indices": np.zeros(0, np.int64) if batch is None else batch.indices.copy(),
                "batch_retest": np.zeros(0, bool) if batch is None else batch.retest.copy(),
                "batch_step": -1 if batch is None else batch.step,
                "batch_policy_step": -1 if batch is None else batch.policy_step}

    @classmethod
    def read_fields(cls, state: Mapping, where: str, *, size: int, num_prompts: int, offset: int, started: int,
                    unit: str) -> PromptBatch | None:
        """The batch `fields` saved in ``state`` (None between batches), checked against the loader's
        ``offset`` into it and the number of batches its epoch has ``started``; `InvalidState` names the bad
        field. ``unit`` is what the loader calls a batch in its messages ("chunk", "batch")."""
        indices = array(state, "batch_indices", where, (-1,), "iu", np.int64)
        retest = array(state, "batch_retest", where, (-1,), "b", np.bool_)
        handing_out = len(indices) > 0
        require(len(indices) in (0, size), f"{where}['batch_indices'] must hold the current {unit}'s {size} "
                                           f"prompts (none while no {unit} is handed out), got {len(indices)}")
        require(len(retest) == len(indices), f"{where}['batch_retest'] must hold one retest flag per entry of "
                                             f"'batch_indices' ({len(indices)}), got {len(retest)}")
        require(handing_out or offset == 0, f"{where}['offset'] is {offset} but no {unit} is being handed out")
        require(not handing_out or started >= 1, f"{where}: a {unit} is being handed out but the epoch has "
                                                  f"started none")
        require(not handing_out or bool(((indices >= 0) & (indices < num_prompts)).all()),
                f"{where}['batch_indices'] must lie in [0, {num_prompts})")
        step = integer(state, "batch_step", where, -1)
        policy_step = integer(state, "batch_policy_step", where, -1)
        return cls(indices, retest, step, policy_step) if handing_out else None


class _EverDrawn:
    """Whether prompts were ever drawn, read only at the indices a feedback call names (`read_groups`'s
    ``drawn``): a mask of all N prompts would cost O(N) per call."""

    def __init__(self, last_drawn: np.ndarray) -> None:
        self.last_drawn = last_drawn

    def __getitem__(self, indices: np.ndarray) -> np.ndarray:
        return self.last_drawn[indices] >= 0


class PromptSampler:
    """Batches of prompt indices drawn by a priority rule fed with each group's rewards (see the module doc).

    Args:
        num_prompts: N, the size of the prompt set.
        batch_size: prompts per `next_batch` (B = TRL's ``generation_batch_size // num_generations``).
        rule: a `PriorityRule` (default `Learnability`: p(1−p) from 0/1 rewards).
        group_size: G, completions per prompt; needed for rewards given one per completion, and then checked.
        prior: the priority of a prompt never measured (default: the rule's ``default_prior``); with ``labels``,
            of a prompt whose bucket has no measured group yet.
        labels: one integer label per prompt (a difficulty bucket, a source): each bucket's prior becomes the
            running mean of its groups' signals, and its prompts' estimates shrink toward it.
        prior_strength: m > 0, the prior's weight in groups.
        prior_memory: the factor a bucket's running mean keeps of its past per feedback call, in [0, 1).
        exploration: ε, the share of draws taken uniformly among active prompts (the exploration floor).
        retest_every: every this many batches, retests lead the batch (None: never).
        retest_size: places for retests in such a batch, at most ``batch_size`` (with ``retest_size =
            batch_size`` such a batch holds only retests while judged prompts are waiting).
        stale_after: N policy steps: a record loses half its weight each N steps it is not re-measured (None: never).
        retire_after: retire a prompt solved in this many groups in a row (None: never).
        solved_reward: a group is solved when every reward is at least this.
        seed: the generator's seed.

    Example:
        >>> import numpy as np
        >>> sampler = PromptSampler(100, 8, group_size=4, seed=0)
        >>> batch = sampler.next_batch()
        >>> rewards = (np.random.default_rng(0).random((8, 4)) < 0.5).astype(float)
        >>> sampler.feedback(batch.indices, rewards=rewards)
        8
    """

    def __init__(self, num_prompts: int, batch_size: int, *, rule: PriorityRule | None = None,
                 group_size: int | None = None, prior: float | None = None, labels: Any = None,
                 prior_strength: float = 1.0, prior_memory: float = 0.9, exploration: float = 0.05,
                 retest_every: int | None = None, retest_size: int = 1, stale_after: int | None = None,
                 retire_after: int | None = None, solved_reward: float = 1.0, seed: int = 0) -> None:
        n = self.num_prompts = checks.integer("num_prompts", num_prompts, 1)
        self.batch_size = checks.integer("batch_size", batch_size, 1, n, why="the prompts of a batch are distinct")
        self.rule = Learnability() if rule is None else rule
        if isinstance(self.rule, type):
            raise TypeError(f"rule must be a PriorityRule instance, got the class {self.rule.__name__}: pass "
                            f"rule={self.rule.__name__}()")
        if not isinstance(self.rule, PriorityRule):
            raise TypeError(f"rule must be a PriorityRule (name, binary, default_prior, signals), got "
                            f"{type(self.rule).__name__}")
        self.group_size = checks.optional_integer("group_size", group_size, 2)
        self.prior = checks.number("prior", self.rule.default_prior if prior is None else prior, 0.0)
        self.prior_strength = checks.number("prior_strength", prior_strength, 0.0, low_open=True)
        self.prior_memory = checks.number("prior_memory", prior_memory, 0.0, 1.0)
        if self.prior_memory == 1.0:
            raise ValueError("prior_memory must be < 1 (a running mean that keeps all its past never learns), got 1.0")
        self.exploration = checks.number("exploration", exploration, 0.0, 1.0)
        self.retest_every = checks.optional_integer("retest_every", retest_every, 1)
        self.retest_size = checks.integer("retest_size", retest_size, 1, self.batch_size,
                                          why=f"retests take places of a batch of batch_size={self.batch_size}")
        self.stale_after = checks.optional_integer("stale_after", stale_after, 1)
        self.retire_after = checks.optional_integer("retire_after", retire_after, 1)
        self.solved_reward = checks.number("solved_reward", solved_reward)
        self.seed = checks.integer("seed", seed, 0)
        self._set_labels(labels)
        self._trees = PromptTrees(n, [len(m) for m in self.members])
        self._calendar = (DecayCalendar(self.stale_after, self.bucket_of, self.position)
                          if self.stale_after is not None else None)
        self._unrefreshed = np.empty(0, np.int64)  # drawn prompts whose leaves still wait (see the module doc)
        self._reset(seed_state(self.seed))

    def _set_labels(self, labels: Any) -> None:
        n = self.num_prompts
        self.learn_prior = labels is not None
        if labels is None:
            self.label_values = np.zeros(1, np.int64)
            self.bucket_of = np.zeros(n, np.int64)
        else:
            raw = checks.index_array("labels", labels, length=n, why="one integer per prompt")
            self.label_values, self.bucket_of = np.unique(raw, return_inverse=True)
            self.bucket_of = self.bucket_of.astype(np.int64).reshape(n)
        self.num_buckets = len(self.label_values)
        order = np.argsort(self.bucket_of, kind="stable")
        starts = np.searchsorted(self.bucket_of[order], np.arange(self.num_buckets + 1))
        self.members = [order[starts[b]:starts[b + 1]] for b in range(self.num_buckets)]
        self._member_order, self._member_start = order.astype(np.int64), starts[:-1].astype(np.int64)
        self.position = np.empty(n, np.int64)  # where prompt i sits in its bucket's tree
        for members in self.members:
            self.position[members] = np.arange(len(members))
        self._labels_digest = sha256_bytes(self.bucket_of.tobytes()) if self.learn_prior else None

    def _reset(self, rng: np.ndarray) -> None:
        n, k = self.num_prompts, self.num_buckets
        self.rng_state = rng
        self.groups = np.zeros(n)
        self.attempts = np.zeros(n)
        self.successes = np.zeros(n)
        self.signal_sum = np.zeros(n)
        self.measured_at = np.full(n, -1, np.int64)
        self.last_tested = np.full(n, -1, np.int64)  # last measured or drawn as a retest: the retest queue's order
        self.last_drawn = np.full(n, -1, np.int64)  # the batch that last drew it (-1: never drawn)
        self.streak = np.zeros(n, np.int64)
        self.retired = np.zeros(n, np.bool_)
        self.bucket_sum = np.zeros(k)
        self.bucket_weight = np.zeros(k)
        self.clock = 0
        self.step = 0
        self.counters = {"drawn": 0, "retests": 0, "exploration_draws": 0, "feedback_calls": 0, "groups": 0,
                         "zero_variance_groups": 0, "retired": 0}
        self.last_zero_variance = 0.0
        self._rebuild()

    # ------------------------------------------------------------------ priorities
    def prior_values(self) -> np.ndarray:
        """Each bucket's current prior (one value without ``labels``)."""
        if not self.learn_prior:
            return np.full(1, self.prior)
        known = self.bucket_weight > 0
        return np.where(known, self.bucket_sum / np.where(known, self.bucket_weight, 1.0), self.prior)

    def _record_args(self) -> tuple:
        """The kernels' record arguments, in their order (the arrays are read at each call: `load_state_dict`
        replaces them)."""
        return (self.clock, self.prior_strength, self.stale_after or 0, self.groups, self.signal_sum,
                self.measured_at, self.last_tested, self.retired)

    def _refresh(self, idx: np.ndarray) -> None:
        """Rewrite every tree's leaves of the prompts ``idx`` from their records."""
        kernels.refresh(idx, *self._record_args(), self.bucket_of, self.position, *self._trees.arrays())

    def _settle(self) -> None:
        """Bring the trees up to date (the last batch's leaves) before they are read."""
        if len(self._unrefreshed):
            self._refresh(self._unrefreshed)
            self._unrefreshed = self._unrefreshed[:0]

    def _rebuild(self) -> None:
        kernels.rebuild(*self._record_args(), self.bucket_of, self.position, *self._trees.arrays())
        self._unrefreshed = np.empty(0, np.int64)
        if self._calendar is not None:
            self._calendar.reset(self.measured_at, self.retired, self.groups, self.signal_sum, self.clock)

    def priorities(self, indices: Any = None) -> np.ndarray:
        """Each prompt's priority as the trees hold it (0 for a retired one), for all N or the given indices."""
        self._settle()
        idx = np.arange(self.num_prompts) if indices is None else np.asarray(indices, np.int64)
        buckets = self.bucket_of[idx]
        c = self._trees.prior_leaves(buckets, self.position[idx])
        return self._trees.data_leaves(idx) + c * self.prior_values()[buckets]

    def probabilities(self, indices: Any = None) -> np.ndarray:
        """P(i) of the next single draw (a batch's first prioritized place), for all N or the given indices."""
        priorities = self.priorities()
        live = ~self.retired
        total = priorities.sum()
        uniform = live / max(1, int(live.sum()))
        p = (1.0 - self.exploration) * priorities / total + self.exploration * uniform if total > 0 else uniform
        return p if indices is None else p[np.asarray(indices, np.int64)]

    # ------------------------------------------------------------------ drawing
    def __len__(self) -> int:
        """Batches per epoch, as TRL counts them: N // batch_size (an incomplete last chunk is dropped)."""
        return self.num_prompts // self.batch_size

    def next_batch(self) -> PromptBatch:
        """The next ``batch_size`` prompts. Raises a RuntimeError when retirement left fewer than ``batch_size``
        active prompts (a batch's prompts are distinct)."""
        self._settle()
        active = self._trees.active_count()
        if active < self.batch_size:
            raise RuntimeError(f"next_batch needs batch_size={self.batch_size} distinct active prompts but only "
                               f"{active} of {self.num_prompts} are active (the others were retired after "
                               f"retire_after={self.retire_after} solved groups in a row): draw fewer with "
                               f"sample(k), or set a larger retire_after")
        return self.sample(self.batch_size)

    def sample(self, k: int) -> PromptBatch:
        """``k`` distinct prompts: retests first when this batch is due for them, then draws by priority."""
        self._settle()
        active = self._trees.active_count()
        if active == 0:
            raise RuntimeError("every prompt is retired: nothing left to draw")
        k = checks.integer("k", k, 1, active, why=f"{active} of {self.num_prompts} prompts are not retired"
                           ", and a batch's prompts are distinct")
        due = self.retest_every is not None and self.step % self.retest_every == 0
        indices = np.empty(k, np.int64)
        retests, explored = kernels.draw(
            self.rng_state, min(self.retest_size, k) if due else 0, self.exploration, self.prior_values(), indices,
            self.clock, self.step, self.last_tested, self.last_drawn, self.bucket_of, self.position,
            self._member_order, self._member_start, *self._trees.arrays())
        self._unrefreshed = indices.copy()  # the batch's array is the caller's to change
        batch = PromptBatch(indices, np.arange(k) < retests, self.step, self.clock)
        self.step += 1
        self.counters["drawn"] += k
        self.counters["retests"] += retests
        self.counters["exploration_draws"] += explored
        return batch

    # ------------------------------------------------------------------ feedback
    def feedback(self, prompt_indices: Any, *, rewards: Any, policy_step: int | None = None) -> int:
        """Record each group's rewards: ``prompt_indices`` (k,) with ``rewards`` (k, G), or one index and one
        reward per completion (k·G,), each prompt G times in a row (TRL's layout). Call it once per generation
        batch. ``policy_step`` is the step the rollouts' policy had (default: one more than the last call's).
        Returns how many groups were recorded.

        Bad input (a wrong shape, NaN, a non-0/1 reward for a binary rule, a prompt this sampler never drew, a
        prompt named in two groups of one call, a group of the wrong size, a step that goes back) raises a
        ValueError naming the argument and the value, and nothing changes.

        Feedback is not matched to draws: a second call for the same batch is taken as new groups of those prompts
        (they count twice, and the clock advances again), as a re-generation of the same prompts would be. So
        call it exactly once per generated batch.
        """
        idx, values = read_groups(prompt_indices, rewards, group_size=self.group_size, binary=self.rule.binary,
                                  rule_name=type(self.rule).__name__, num_prompts=self.num_prompts,
                                  drawn=_EverDrawn(self.last_drawn))
        order = np.argsort(idx, kind="stable")
        again = np.flatnonzero(idx[order][1:] == idx[order][:-1])
        if len(again):
            first, second = sorted(order[again[0]:again[0] + 2].tolist())
            raise ValueError(f"prompt_indices names prompt {idx[first]} in groups {first} and {second} of this call: "
                             f"a feedback call takes each drawn prompt's group once (a batch's prompts are "
                             f"distinct); merge its completions into one group or feed them in separate calls")
        signals = np.asarray(self.rule.signals(values), np.float64)
        if signals.shape != (len(idx),) or not (np.isfinite(signals) & (signals >= 0)).all():
            raise ValueError(f"{type(self.rule).__name__}.signals must return {len(idx)} finite values >= 0, got "
                             f"{signals!r}")
        now = self.clock + 1 if policy_step is None else checks.integer(
            "policy_step", policy_step, self.clock, why=f"the last feedback was at policy step {self.clock}")
        # Everything is checked: from here on the sampler changes.
        since, self.clock = self.clock, now
        solved = (values >= self.solved_reward).all(axis=1)
        self.counters["retired"] += kernels.record_groups(
            idx, float(values.shape[1]), values.sum(axis=1), signals, solved, now, self.stale_after or 0,
            self.retire_after or 0, self.groups, self.attempts, self.successes, self.signal_sum, self.measured_at,
            self.last_tested, self.streak, self.retired)
        if self.learn_prior:
            kernels.learn_priors(self.bucket_of[idx], signals, self.prior_memory, self.bucket_sum, self.bucket_weight)
        zero = int((values == values[:, :1]).all(axis=1).sum())
        self.counters["feedback_calls"] += 1
        self.counters["groups"] += len(idx)
        self.counters["zero_variance_groups"] += zero
        self.last_zero_variance = zero / len(idx)
        self._refresh_fed(np.concatenate((self._unrefreshed, idx)), since)
        return len(idx)

    def _refresh_fed(self, changed: np.ndarray, since: int) -> None:
        """Rewrite the leaves of the prompts ``changed`` (fed, or drawn since the last write) and of the records
        that halved after policy step ``since`` (the calendar says which; the fed prompts are entered first, so
        their former entries are not among them)."""
        if self._calendar is None:
            self._refresh(changed)
        else:
            self._calendar.add(changed[len(self._unrefreshed):], self.clock, self.retired, self.groups,
                               self.signal_sum, since=since)
            kernels.refresh_fed(changed, self._calendar.due(since, self.clock), *self._calendar.arrays(),
                                *self._record_args(), self.bucket_of, self.position, *self._trees.arrays())
        self._unrefreshed = self._unrefreshed[:0]

    # ------------------------------------------------------------------ introspection
    def pass_rates(self) -> np.ndarray:
        """Each prompt's measured mean reward, successes / attempts (its pass rate for 0/1 rewards); NaN where
        never measured. For plots of pass rates over training."""
        measured = self.attempts > 0
        return np.divide(self.successes, self.attempts, out=np.full(self.num_prompts, np.nan), where=measured)

    def judged(self) -> np.ndarray:
        """A boolean mask of length N (not indices): True for the active prompts judged solved or unsolved,
        measured with every measured group giving no signal (the retest queue). ``np.flatnonzero`` gives their
        indices."""
        self._settle()
        return np.isfinite(self._trees.retest_keys(np.arange(self.num_prompts)))

    def stats(self) -> dict[str, Any]:
        """Counters, the share of zero-variance groups in the last feedback call (TRL's ``frac_reward_zero_std``)
        and overall, the active / judged / measured prompt counts and the bucket priors. O(N): for logging."""
        self._settle()
        groups = self.counters["groups"]
        return {"step": self.step, "policy_step": self.clock, **self.counters,
                "frac_zero_variance": self.last_zero_variance,
                "frac_zero_variance_total": self.counters["zero_variance_groups"] / groups if groups else 0.0,
                "active": self._trees.active_count(), "judged": int(self.judged().sum()),
                "measured": int((self.measured_at >= 0).sum()), "priors": self.prior_values().tolist()}

    # ------------------------------------------------------------------ checkpoint
    def config(self) -> dict:
        return {"num_prompts": self.num_prompts, "batch_size": self.batch_size, "rule": self.rule.name,
                "group_size": self.group_size, "prior": self.prior, "labels": self._labels_digest,
                "prior_strength": self.prior_strength, "prior_memory": self.prior_memory,
                "exploration": self.exploration, "retest_every": self.retest_every, "retest_size": self.retest_size,
                "stale_after": self.stale_after, "retire_after": self.retire_after,
                "solved_reward": self.solved_reward, "seed": self.seed}

    def _max_signal(self) -> float:
        """The rule's largest signal of one group (inf when the rule does not say): bounds a state's signal sums."""
        bound = getattr(self.rule, "max_signal", None)
        return float(bound(self.group_size)) if callable(bound) else float("inf")

    _FLOATS = ("groups", "attempts", "successes", "signal_sum")
    _INTS = ("measured_at", "last_tested", "last_drawn", "streak")

    def state_dict(self) -> dict:
        """A snapshot (copies) of everything the next draws and feedback depend on: records, clock, RNG."""
        return {"version": STATE_VERSION, "config": self.config(),
                **{name: getattr(self, name).copy() for name in (*self._FLOATS, *self._INTS)},
                "retired": self.retired.copy(), "bucket_sum": self.bucket_sum.copy(),
                "bucket_weight": self.bucket_weight.copy(), "clock": self.clock, "step": self.step,
                "rng": self.rng_state.copy(), "counters": dict(self.counters),
                "last_zero_variance": np.float64(self.last_zero_variance)}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore a `state_dict` of a sampler with the same configuration; the next batch is the one that would
        have followed. Every value is checked first (`InvalidState` names the bad field) and a refused state
        leaves the sampler as it was."""
        where = check_header(state, STATE_VERSION, self.config(), "prompt sampler")
        n, k = self.num_prompts, self.num_buckets
        clock = integer(state, "clock", where, 0)
        step = integer(state, "step", where, 0)
        new: dict[str, Any] = {}
        for name in self._FLOATS:
            new[name] = array(state, name, where, (n,), "fiu", np.float64)
            if name == "successes":  # a sum of rewards: graded rewards may be negative
                bad = np.flatnonzero(~np.isfinite(new[name]))
                require(not len(bad), f"{where}['successes'][{bad[:1].tolist()}] must be finite")
            else:
                finite_nonnegative(new[name], f"{where}[{name!r}]")
        for name, low, high in (("measured_at", -1, clock), ("last_tested", -1, clock), ("last_drawn", -1, step - 1),
                                ("streak", 0, None)):
            new[name] = array(state, name, where, (n,), "iu", np.int64)
            bad = (new[name] < low) | (new[name] > high if high is not None else False)
            require(not bad.any(), f"{where}[{name!r}] must lie in [{low}, {high if high is not None else 'inf'}], "
                                   f"got {new[name][bad][:1].tolist()}")
        require(not (new["successes"] > new["attempts"]).any() or not self.rule.binary,
                f"{where}: successes exceed attempts")
        if self.group_size is not None:  # every group adds G completions, and a decay scales both alike
            off = np.flatnonzero(np.abs(new["attempts"] - self.group_size * new["groups"])
                                 > 1e-9 * np.maximum(new["attempts"], 1.0))
            i = int(off[0]) if len(off) else 0
            require(not len(off), f"{where}['attempts'][{i}] = {float(new['attempts'][i])!r} must be group_size="
                                  f"{self.group_size} x {where}['groups'][{i}] = {float(new['groups'][i])!r} (a "
                                  f"damaged state)")
        new["retired"] = array(state, "retired", where, (n,), "b", np.bool_)
        for name in ("bucket_sum", "bucket_weight"):
            new[name] = array(state, name, where, (k,), "fiu", np.float64)
            finite_nonnegative(new[name], f"{where}[{name!r}]")
        top = self._max_signal()
        for total, count in (("signal_sum", "groups"), ("bucket_sum", "bucket_weight")) if np.isfinite(top) else ():
            over = np.flatnonzero(new[total] > top * new[count] * (1.0 + 1e-9) + 1e-12)
            i = int(over[0]) if len(over) else 0
            require(not len(over), f"{where}[{total!r}][{i}] = {float(new[total][i])!r} exceeds what "
                                   f"{float(new[count][i])!r} "
                                   f"groups ({where}[{count!r}][{i}]) can give: {type(self.rule).__name__} gives at "
                                   f"most {top:.6g} per group (a damaged state)")
        rng = rng_words(state, "rng", where)
        counts = counters(state, "counters", where, self.counters)
        retired = int(new["retired"].sum())  # a prompt retires once, for good, and counts then
        require(self.retire_after is not None or retired == 0,
                f"{where}['retired'] marks {retired} prompts retired, but retire_after=None retires none")
        require(counts["retired"] == retired, f"{where}['counters']['retired'] = {counts['retired']} but "
                                              f"{where}['retired'] marks {retired} prompts (a damaged state)")
        last_zero = number(state, "last_zero_variance", where, 0.0)
        require(last_zero <= 1.0, f"{where}['last_zero_variance'] must be a share in [0, 1], got {last_zero!r}")
        # Everything is checked: from here on nothing can fail.
        for name, value in new.items():
            setattr(self, name, value)
        self.clock, self.step, self.rng_state, self.counters = clock, step, rng, counts
        self.last_zero_variance = float(last_zero)
        self._rebuild()
