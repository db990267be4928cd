"""The prioritized-replay rule, written once and shared by both SB3 buffer classes (a mixin).

Why a mixin: SB3 has two replay buffers (flat and dict observations) that differ only in how a batch is
gathered from storage. Everything about priorities (where they live, how a batch is drawn, how weights are
computed, what feedback is accepted, how the state is pickled) is the same for both, so it lives here, and
each concrete class only says how to read rows (`_gather`).

The rule (proportional PER, Schaul et al. 2016):

* one `replayloader.SumTree` leaf per (position, env) slot, flat slot = ``position * n_envs + env``, so every
  env's transition is its own sampling unit (SB3's uniform buffer picks a position, then an env);
* a leaf holds ``(priority + priority_eps) ** alpha``; a new transition gets the largest
  ``priority + priority_eps`` seen so far (1 before any feedback), so it is replayed soon at least once;
* a batch of K is stratified: draw j falls in the j-th of K equal slices of the total mass;
  P(i) = leaf_i / sum(leaves);
* importance weights ``(N * P(i)) ** -beta`` divided by their largest possible value over the buffer, which is
  ``(N * P_min) ** -beta``; so ``w_i = (P_min / P(i)) ** beta`` <= 1 (the tree keeps the smallest positive
  leaf at its root, so P_min costs nothing);
* beta comes from a float or from a schedule called with the training progress (0 at the start of
  ``learn``, 1 at its end; the prioritized algorithms set it before each update).

Cost, kept close to SB3's uniform buffer's: a new transition's leaf is written at the next tree read or write
(a sample, a feedback, `priorities`, `tree`, a pickle), all the transitions added since in one tree write, not
one write per `add`; the tree holds exactly the leaves it would hold after per-`add` writes (a sum tree's nodes
are a function of its leaves). Beta is evaluated once per value of `progress` (and of ``beta``), not per sample.

Missing feedback is an error, not a silent fallback: with ``require_feedback=True`` (the default) a
`sample` raises `MissingFeedbackError` when the previous prioritized sample got no `feedback` (or its alias
`update_priorities`, the name SB3 and cpprb users know) call since. An algorithm that never feeds priorities back (SB3's own DQN, SAC, ...) would otherwise train on
max-priority, i.e. near-uniform, replay with importance weights attached and no warning. Pass
``require_feedback=False`` to sample without feeding back on purpose (for inspection, say).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces

from .. import _checks as checks
from ..sampler import LinearSchedule
from ..schedules import value_at
from ..sumtree import SumTree

BetaSchedule = Callable[[float], float]


class MissingFeedbackError(RuntimeError):
    """`sample` was called again before the previous prioritized batch got `update_priorities`."""


def _default_beta() -> LinearSchedule:
    """PER's annealing: beta 0.4 at the start of training, 1.0 at its end (progress runs from 0 to 1)."""
    return LinearSchedule(0.4, 1.0, steps=1)


class PrioritizedMixin:
    """Proportional prioritized sampling over SB3's storage; see the module docstring for the rule.

    Goes first in the bases (``class X(PrioritizedMixin, ReplayBuffer)``); the concrete class supplies
    ``_gather(rows, envs, env) -> tuple`` (SB3's six sample fields) and ``_samples_type``; it may also
    override ``_read(slots, env)``, which reads the same fields by flat slot (by default through `_gather`).
    """

    _samples_type: type

    def __init__(self, buffer_size: int, observation_space: spaces.Space, action_space: spaces.Space,
                 device: th.device | str = "auto", n_envs: int = 1, optimize_memory_usage: bool = False, handle_timeout_termination: bool = True,
                 *, alpha: float = 0.6, beta: float | BetaSchedule | None = None, priority_eps: float = 1e-6,
                 require_feedback: bool = True, seed: int | None = None) -> None:
        self.alpha = checks.number("alpha", alpha, 0.0)
        if beta is None:
            beta = _default_beta()
        elif not callable(beta):
            beta = checks.number("beta", beta, 0.0, 1.0)
        self.beta: float | BetaSchedule = beta
        self.priority_eps = checks.number("priority_eps", priority_eps, 0.0, low_open=True)
        if not isinstance(require_feedback, (bool, np.bool_)):
            raise ValueError(f"require_feedback must be a bool, got {require_feedback!r}")
        self.require_feedback = bool(require_feedback)
        checks.optional_integer("seed", seed, 0)
        super().__init__(buffer_size, observation_space, action_space, device, n_envs=n_envs,  # type: ignore[call-arg]
                         optimize_memory_usage=optimize_memory_usage,
                         handle_timeout_termination=handle_timeout_termination)
        # With seed=None the stream still follows numpy's global RNG, which SB3 seeds from `seed=` of the model.
        self._rng = np.random.default_rng(np.random.randint(2**31 - 1) if seed is None else int(seed))
        self._env_slots = np.arange(self.n_envs, dtype=np.int64)
        self._install_tree(self._new_tree())
        self._progress = 0.0
        self._reset_priorities()
        self._forget_cache()

    _CACHES = ("_unwritten", "_unwritten_from", "_beta_at", "_priority_limit")  # derived state: never pickled

    def _forget_cache(self) -> None:
        """No add waiting for its tree write, no beta evaluated yet."""
        self._unwritten = 0  # adds since the last tree write, at consecutive positions from _unwritten_from
        self._unwritten_from = 0
        self._beta_at: tuple = (None, None, None)  # (beta, progress, value) of the last evaluation

    # ----------------------------------------------------------------------------------------------- state
    @property
    def tree(self) -> SumTree:
        """The `replayloader.SumTree` of the sampling masses, one leaf per flat slot (up to date: reading it
        first writes the leaves of transitions added since the last tree access)."""
        self._write_new_leaves()
        return self._tree

    def _install_tree(self, tree: SumTree) -> None:
        """Use ``tree``, and refuse from now on any priority + eps whose mass would overflow it
        (`SumTree.max_weight`)."""
        self._tree = tree
        self._priority_limit = tree.max_weight(self.alpha)

    def _new_tree(self) -> SumTree:
        return SumTree(self.buffer_size * self.n_envs, np.float64, min_priority=True, min_key=False,
                       raw_sum=False)

    def _reset_priorities(self) -> None:
        self.max_priority = 1.0  # largest priority + eps seen; PER's value for new transitions
        self._new_leaves = np.full(self.n_envs, self.max_priority ** self.alpha)
        self._awaiting_feedback = False

    def reset(self) -> None:
        super().reset()  # type: ignore[misc]
        self._tree.clear()
        self._reset_priorities()
        self._forget_cache()

    @property
    def progress(self) -> float:
        """Fraction of training done, in [0, 1]: the argument a beta schedule is called with."""
        return self._progress

    @progress.setter
    def progress(self, value: float) -> None:
        if type(value) is float and 0.0 <= value <= 1.0:  # what the training loop sets, before every update
            self._progress = value
        else:
            self._progress = checks.number("progress", value, 0.0, 1.0)

    def current_beta(self) -> float:
        """Beta for the next sample: the float given, or the schedule at the current `progress`.

        Evaluated (and checked) once per (``beta``, `progress`) pair: `progress` moves once per ``train``
        call, while a batch is drawn every gradient step."""
        beta, progress, value = self._beta_at
        if beta is self.beta and progress == self._progress:
            return value
        try:
            value = value_at("beta", self.beta, self._progress, high=1.0)
        except ValueError as exc:
            raise ValueError(f"the beta schedule must return a finite number in [0, 1] ({exc}), at "
                             f"progress {self._progress}") from None
        self._beta_at = (self.beta, self._progress, value)
        return value

    def stored_slots(self) -> int:
        """How many flat (position, env) slots hold a transition: valid indices are [0, stored_slots())."""
        return self.size() * self.n_envs  # type: ignore[attr-defined]

    def priorities(self) -> np.ndarray:
        """The sampling mass of every stored slot, ``(priority + eps) ** alpha`` (0: never sampled)."""
        return self.tree.get(np.arange(self.stored_slots())).copy()

    # ------------------------------------------------------------------------------------------------- add
    def add(self, *args: Any, **kwargs: Any) -> None:
        """SB3's add; the new transition's leaf (the largest priority seen) is written with the next tree
        access, together with those of every add since (see the module docstring)."""
        if not self._unwritten:
            self._unwritten_from = self.pos  # type: ignore[attr-defined]
        super().add(*args, **kwargs)  # type: ignore[misc]
        self._unwritten += 1

    def _write_new_leaves(self) -> None:
        """Give the slots of the transitions added since the last call the new-transition leaf, in one tree
        write. The leaf cannot have changed meanwhile: only `feedback` changes it, and it calls this first."""
        if not self._unwritten:
            return
        count = min(self._unwritten, self.buffer_size)  # type: ignore[attr-defined]
        self._unwritten = 0
        positions = np.arange(self._unwritten_from, self._unwritten_from + count, dtype=np.int64)
        if positions[-1] >= self.buffer_size:  # type: ignore[attr-defined]
            positions %= self.buffer_size  # type: ignore[attr-defined]
        slots = positions if self.n_envs == 1 else (positions[:, None] * self.n_envs + self._env_slots).ravel()
        leaves = np.full(slots.shape[0], self._new_leaves[0])
        self._tree.set_unchecked(slots, leaves, leaves, leaves)
        if self.optimize_memory_usage:  # type: ignore[attr-defined]
            # The current position's observation was overwritten by the last transition's next observation:
            # that transition is no longer valid (SB3 excludes it from sampling for the same reason). Every
            # earlier add's stale slot was the next add's own slot, rewritten above.
            stale = self._env_slots + self.pos * self.n_envs  # type: ignore[attr-defined]
            zeros = np.zeros(self.n_envs)
            self._tree.set_unchecked(stale, zeros, zeros, zeros)

    # ---------------------------------------------------------------------------------------------- sample
    def sample(self, batch_size: int, env: Any = None) -> Any:
        """A stratified prioritized batch: SB3's fields plus ``weights`` (batch, 1) and ``indices`` (batch,).

        Raises `MissingFeedbackError` if ``require_feedback`` and the previous batch got no
        `update_priorities`; ValueError when nothing is stored yet.
        """
        if self._awaiting_feedback:
            raise MissingFeedbackError(
                "sample() was called again, but the previous prioritized batch got no update_priorities(). "
                "The algorithm is not feeding priorities back (SB3's own DQN/SAC/TD3 do not): use "
                "replayloader.sb3.PrioritizedDQN (or PrioritizedQRDQN, PrioritizedSAC, PrioritizedTD3), call "
                "buffer.update_priorities(batch.indices, td_errors) after each sample, or build the buffer "
                "with require_feedback=False to sample without feedback on purpose.")
        if type(batch_size) is not int or batch_size < 1:  # the common case costs one comparison
            batch_size = checks.integer("batch_size", batch_size, 1)
        slots, weights = self._draw(batch_size)
        fields = self._read(slots, env)
        self._awaiting_feedback = self.require_feedback
        # weights is a fresh array of this call: the tensor may share it (no copy on the CPU)
        return self._samples_type(*fields, self.to_torch(weights.reshape(-1, 1), copy=False), slots)  # type: ignore

    def _draw(self, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """Slots drawn with P(i) ∝ leaf_i (stratified) and their importance weights (P_min / P(i)) ** beta."""
        tree = self.tree
        if not tree.total > 0:
            raise ValueError("cannot sample: the buffer holds no transition yet")
        beta = self.current_beta()
        slots = tree.sample(self._rng.random(batch_size), stratified=True)
        leaves = tree.get(slots)
        weights = (tree.min_priority() / leaves) ** beta
        return slots, weights.astype(np.float32)

    def _read(self, slots: np.ndarray, env: Any) -> tuple:
        """SB3's six sample fields for flat slots: by default through `_gather` with (position, env) pairs."""
        rows, envs = np.divmod(slots, self.n_envs)
        return self._gather(rows, envs, env)

    def _gather(self, rows: np.ndarray, envs: np.ndarray, env: Any) -> tuple:
        raise NotImplementedError

    # -------------------------------------------------------------------------------------------- feedback
    def update_priorities(self, indices: Any, priorities: Any) -> None:
        """``feedback(indices, priority=priorities)`` under the name SB3 and cpprb users expect (an alias, not
        deprecated)."""
        self.feedback(indices, priority=priorities)

    def feedback(self, indices: Any, *, priority: Any) -> None:
        """Set the priorities (e.g. |TD error|) of sampled slots, in one batched tree write; the library's
        feedback verb (`update_priorities` is its alias).

        ``indices``: the ``indices`` of a batch (flat slots); ``priority``: same shape, finite, >= 0. The
        stored sampling mass is ``(priority + priority_eps) ** alpha``. Everything is checked before anything is
        written: on a ValueError the buffer is unchanged. A slot given twice keeps its last value. A slot whose
        transition became invalid since it was sampled (``optimize_memory_usage``) is skipped.

        >>> import numpy as np
        >>> from gymnasium import spaces
        >>> from replayloader.sb3 import PrioritizedReplayBuffer
        >>> buffer = PrioritizedReplayBuffer(8, spaces.Box(-1, 1, (2,)), spaces.Discrete(2), seed=0)
        >>> for _ in range(4):
        ...     buffer.add(np.zeros(2), np.zeros(2), np.array([0]), np.array([1.0]), np.array([False]), [{}])
        >>> batch = buffer.sample(3)
        >>> buffer.feedback(batch.indices, priority=np.array([0.5, 2.0, 0.1]))
        >>> buffer.update_priorities(np.array([9]), np.array([1.0]))  # the same, by SB3's name
        Traceback (most recent call last):
        ...
        ValueError: indices must lie in [0, 4) (the stored (position, env) slots), got indices[0] = 9
        """
        slots, values, top = self._check_feedback(indices, priority)
        if self.optimize_memory_usage and self.full:  # type: ignore[attr-defined]
            valid = slots // self.n_envs != self.pos  # type: ignore[attr-defined]
            slots, values = slots[valid], values[valid]
            top = float(values.max()) if values.size else 0.0
        if values.size:
            tree = self.tree  # first the leaves of the transitions added since the last write
            masses = values ** self.alpha
            tree.set_unchecked(slots, masses, masses, masses)  # slots checked above, int64 and contiguous
            if top > self.max_priority:
                self.max_priority = top
                self._new_leaves = np.full(self.n_envs, top ** self.alpha)
        self._awaiting_feedback = False

    def _check_feedback(self, indices: Any, priorities: Any) -> tuple[np.ndarray, np.ndarray, float]:
        """The checked slots (int64), their priorities plus eps (float64) and the largest of those (0.0 when
        none): raises the ValueError of the first problem found, before anything is written. Errors name
        `feedback`'s keyword, ``priority`` (`update_priorities` is its alias)."""
        slots = np.asarray(indices)
        if slots.ndim != 1:
            raise ValueError(f"indices must be a 1-D array of sampled slots, got shape {slots.shape}")
        if slots.size and slots.dtype.kind not in "iu":
            raise ValueError(f"indices must be integers, got dtype {slots.dtype}")
        try:
            values = np.asarray(priorities, dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise ValueError(f"priority must be an array of numbers, got {priorities!r}") from err
        if values.shape != slots.shape:
            raise ValueError(f"priority must have the shape of indices {slots.shape}, got shape {values.shape}")
        slots = np.ascontiguousarray(slots, dtype=np.int64)  # what the tree write takes
        if not slots.size:
            return slots, values, 0.0
        stored = self.stored_slots()
        # one reduction (a negative slot reads as a huge unsigned one), and the ufuncs' own reductions: this
        # runs after every gradient step
        if np.maximum.reduce(slots.view(np.uint64)) >= stored:
            j = int(np.flatnonzero((slots < 0) | (slots >= stored))[0])
            raise ValueError(f"indices must lie in [0, {stored}) (the stored (position, env) slots), "
                             f"got indices[{j}] = {slots[j]}")
        top = float(np.maximum.reduce(values))
        limit = self._priority_limit - self.priority_eps
        if not (np.minimum.reduce(values) >= 0 and top <= limit):  # NaN fails both comparisons
            j = int(np.flatnonzero(~((values >= 0) & (values <= limit)))[0])
            if 0 <= values[j] < math.inf:
                raise ValueError(f"priority must be <= {limit:.6g}, so that (priority + priority_eps) ** alpha "
                                 f"stays finite summed over the sum tree; got priority[{j}] = {float(values[j])}")
            raise ValueError(f"priority must be finite and >= 0, got priority[{j}] = {float(values[j])}")
        # adding eps is monotonic, so the largest priority + eps is the largest priority, + eps
        return slots, values + self.priority_eps, top + self.priority_eps

    # -------------------------------------------------------------------------------------------- pickling
    def __getstate__(self) -> dict:
        """SB3 saves a buffer with pickle (`save_replay_buffer`). The tree's column arrays are views of one
        node array, which pickle would split into independent copies; so the leaves travel as one array and
        the tree is rebuilt on load. The sampling RNG (a numpy Generator) pickles with its state."""
        tree = self.tree  # first the leaves of the transitions added since the last write
        state = {key: value for key, value in self.__dict__.items() if key not in self._CACHES}
        del state["_tree"]
        state["_leaves"] = tree.get(np.arange(tree.capacity)).copy()
        return state

    def __setstate__(self, state: dict) -> None:
        leaves = state.pop("_leaves")
        self.__dict__.update(state)
        self._forget_cache()
        self._install_tree(self._new_tree())
        self._tree.set(np.arange(leaves.shape[0], dtype=np.int64), leaves)
