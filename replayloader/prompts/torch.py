"""GRPOPromptSampler: a `PromptSampler` as the ``torch.utils.data.Sampler`` of a GRPO trainer.

Optional module (torch is imported here only).

**Layout.** TRL's GRPOTrainer reads its prompts through ``trl.trainer.utils.RepeatSampler``: each chunk of B
prompt indices (B = ``generation_batch_size // num_generations``) is yielded R = ``num_iterations ×
steps_per_generation`` times, and within each pass every index ``num_generations`` (G) times in a row. This
sampler yields exactly that layout, chunk by chunk, except that each chunk is a `PromptSampler` batch (distinct
prompts drawn by priority) instead of the next slice of a shuffled permutation. So the trainer's groups and its
reuse of a generation batch stay correct. An epoch is ``num_batches`` chunks (default N // B, TRL's count:
``len()`` equals ``len(RepeatSampler(...))``).

**Feedback** comes once per generation batch: `feedback(prompt_indices, rewards=...)` after the batch is scored.
A chunk is drawn lazily, when its first index is asked for, so it sees all feedback given until then.

**Lag.** A DataLoader asks for indices before the trainer has scored the batches it already holds: the
Transformers Trainer fetches one optimizer step's batches at once and accelerate's DataLoaderShard fetches one
batch more, DataLoader workers ``num_workers × prefetch_factor`` more. So when chunk k is drawn, some earlier
chunks may not be fed back yet: that number is chunk k's *lag* (its priorities are that many generations old).
Under TRL's defaults (``num_iterations=1``, ``steps_per_generation`` = gradient accumulation, no workers) it is
1: chunk k + 1 is drawn while chunk k is being generated. With ``num_iterations ≥ 2`` it is 0 (the chunk is
reused before the next is fetched). The sampler measures it at every draw (`stats`: ``lag``, ``max_lag_seen``)
and bounds it: a draw with more than ``max_lag`` chunks awaiting feedback raises, naming the settings that cause
it, instead of silently steering by old priorities (``max_lag=None`` only measures).

**Several processes** (``torch.distributed`` initialized): every rank holds the same `PromptSampler` (checked
when this sampler is built) and yields the same sequence, as TRL requires (accelerate then hands each rank its
slice of each generation batch). `feedback` is a collective: each rank passes its own slice of the generation
batch, completion by completion as its inputs hold them (a slice may start inside a group); one small gather
compares every rank's status, length, draw count, generator state and clock, one more gathers the slices,
concatenated in rank order (the generation batch's order under accelerate), and every rank applies the same
`PromptSampler.feedback`. Bad feedback on any rank raises on every rank, and nothing changes.

**Checkpoints.** `state_dict` holds the prompt sampler and the position in the current chunk (mid-epoch too):
a restored sampler yields the very index that would have come next.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from .. import _checks as checks
from ..distributed.group import current_group
from ..distributed.state_files import state_digest
from ..state.checks import check_header, counters, field, integer
from .groups import read_completions
from .sampler import PromptBatch, PromptSampler

STATE_VERSION = 1
_HEADER = 10  # status, completions, policy step, draws, 4 RNG words, clock, chunks drawn


class GRPOPromptSampler(Sampler[int]):
    """Prompt indices in TRL's ``RepeatSampler`` layout, drawn by a `PromptSampler` (see the module doc).

    Args:
        prompt_sampler: the `PromptSampler` (under DDP built identically on every rank); its ``batch_size`` is B
            and its ``group_size`` must be G.
        num_generations: G, completions per prompt (TRL's ``num_generations``).
        repeat_count: R, how often each chunk is yielded (TRL: ``num_iterations × steps_per_generation``).
        num_batches: chunks per epoch (default N // B, as TRL's sampler).
        max_lag: the most chunks that may await feedback when a chunk is drawn (None: no bound, only measured).
        group: a torch.distributed process group (default: the default group, when one is initialized).

    Example:
        >>> import numpy as np
        >>> prompts = PromptSampler(12, 2, group_size=3, seed=0)
        >>> sampler = GRPOPromptSampler(prompts, num_generations=3, repeat_count=2)
        >>> order = iter(sampler)
        >>> first = [next(order) for _ in range(12)]  # one chunk: 2 prompts x 3 generations, twice
        >>> first[:6] == first[6:] and first[0] == first[1] == first[2]
        True
        >>> sampler.feedback(first[:6], rewards=np.array([1.0, 0.0, 1.0, 1.0, 1.0, 1.0]))
        2
    """

    def __init__(self, prompt_sampler: PromptSampler, *, num_generations: int, repeat_count: int = 1,
                 num_batches: int | None = None, max_lag: int | None = 1, group: Any = None) -> None:
        if not isinstance(prompt_sampler, PromptSampler):
            raise TypeError(f"prompt_sampler must be a PromptSampler, got {type(prompt_sampler).__name__}")
        self.prompts = prompt_sampler
        self.num_generations = checks.integer("num_generations", num_generations, 2)
        if prompt_sampler.group_size != self.num_generations:
            raise ValueError(f"the prompt sampler's group_size is {prompt_sampler.group_size} but num_generations="
                             f"{self.num_generations}: build PromptSampler(..., group_size={self.num_generations})")
        self.repeat_count = checks.integer("repeat_count", repeat_count, 1)
        self.num_batches = (checks.integer("num_batches", num_batches, 1) if num_batches is not None
                            else max(1, len(prompt_sampler)))
        self.max_lag = checks.optional_integer("max_lag", max_lag, 0)
        self.world = current_group(group)
        if self.world is not None:
            self.world.require_same({**self._config(), **prompt_sampler.config(),
                                     "state": state_digest(prompt_sampler.state_dict())}, "GRPOPromptSampler",
                                    "build the same PromptSampler and GRPOPromptSampler on every rank (same prompts, "
                                    "options, seed and state)")
        self.batch: PromptBatch | None = None  # the chunk being yielded
        self.offset = 0  # indices of the current chunk already yielded
        self.chunk = 0  # chunks started in the current epoch
        self.epoch = 0
        self.counters = {"chunks_drawn": 0, "feedback_calls": 0, "lag": 0, "max_lag_seen": 0}

    @property
    def chunk_length(self) -> int:
        """Indices one chunk yields: B × G × R."""
        return self.prompts.batch_size * self.num_generations * self.repeat_count

    def __len__(self) -> int:
        """Indices per epoch, as ``len(RepeatSampler(...))`` counts them."""
        return self.num_batches * self.chunk_length

    def __iter__(self) -> Iterator[int]:
        """The rest of the current epoch (all of it when it has not started); then the next epoch begins."""
        group = self.prompts.batch_size * self.num_generations
        if self.batch is not None and self.offset == self.chunk_length:  # handed out whole (as `state_dict` says)
            self.batch, self.offset = None, 0
        if self.batch is None and self.chunk == self.num_batches:  # the last epoch is over: the next begins
            self.chunk, self.epoch = 0, self.epoch + 1
        while self.batch is not None or self.chunk < self.num_batches:
            if self.batch is None:
                self._draw()
            indices = self.batch.indices
            while self.offset < self.chunk_length:
                index = int(indices[(self.offset % group) // self.num_generations])
                self.offset += 1  # counted before it is handed out: a state_dict taken now resumes after it
                yield index
            self.batch, self.offset = None, 0

    def _draw(self) -> None:
        waiting = self.counters["chunks_drawn"] - self.counters["feedback_calls"]
        if self.max_lag is not None and waiting > self.max_lag:
            raise RuntimeError(
                f"{waiting} generation batches drawn before this one still await feedback (max_lag={self.max_lag}): "
                f"call feedback once per generation batch, after scoring it; a DataLoader with workers or a "
                f"gradient accumulation larger than steps_per_generation draws further ahead (raise max_lag to "
                f"allow it, or max_lag=None to only measure)")
        self.batch = self.prompts.next_batch()
        self.chunk += 1
        self.counters["chunks_drawn"] += 1
        self.counters["lag"] = max(0, waiting)
        self.counters["max_lag_seen"] = max(self.counters["max_lag_seen"], self.counters["lag"])

    # ------------------------------------------------------------------ feedback
    def feedback(self, prompt_indices: Any, *, rewards: Any, policy_step: int | None = None) -> int:
        """Record one generation batch's rewards (`PromptSampler.feedback`; either layout). Under DDP a
        collective: every rank passes its own slice, completion by completion, and gets the same result (groups
        recorded in all). Bad input raises a ValueError naming the argument on the rank that gave it (every
        other rank says which rank), and nothing changes."""
        if self.world is None:
            recorded = self.prompts.feedback(prompt_indices, rewards=rewards, policy_step=policy_step)
        else:
            indices, values, step = self._gather(prompt_indices, rewards, policy_step)
            recorded = self.prompts.feedback(indices, rewards=values, policy_step=step)
        self.counters["feedback_calls"] += 1
        return recorded

    def _gather(self, prompt_indices: Any, rewards: Any, policy_step: int | None) -> tuple[np.ndarray, ...]:
        """Every rank's slice, in rank order, after every rank checked its own."""
        header = np.zeros(_HEADER, np.int64)
        header[2] = -1
        try:
            indices, values = read_completions(prompt_indices, rewards, group_size=self.num_generations,
                                               num_prompts=self.prompts.num_prompts,
                                               drawn=self.prompts.last_drawn >= 0)
            if policy_step is not None:
                header[2] = checks.integer("policy_step", policy_step, 0)
            error = None
        except (ValueError, TypeError) as exc:
            header[0], indices, values, error = 1, np.zeros(0, np.int64), np.zeros(0), exc
        header[1] = len(indices)
        header[3] = self.prompts.step
        header[4:8] = self.prompts.rng_state.view(np.int64)
        header[8] = self.prompts.clock
        header[9] = self.counters["chunks_drawn"]
        table = self.world.all_gather_rows(header)
        if error is not None:
            raise error
        failed = np.flatnonzero(table[:, 0])
        if len(failed):
            raise ValueError(f"rank {failed[0]} rejected its feedback (its own error says why); nothing changed")
        if len({tuple(row[3:]) for row in table}) > 1:
            draws = ", ".join(f"rank {r}: {int(row[3])}" for r, row in enumerate(table))
            raise RuntimeError(f"the ranks' prompt samplers diverged before this feedback (batches drawn: {draws}; "
                               f"or their generator or clock differ): every rank must draw the same chunks and "
                               f"call feedback the same number of times")
        if len(set(table[:, 2].tolist())) > 1:
            raise ValueError(f"policy_step differs across ranks: {table[:, 2].tolist()} (-1: not given); pass "
                             f"the same step on every rank")
        merged_indices, merged_rewards = self.world.all_gather_ragged(indices, values, table[:, 1])
        return merged_indices, merged_rewards, None if table[0, 2] < 0 else int(table[0, 2])

    def stats(self) -> dict[str, Any]:
        """The prompt sampler's statistics plus the epoch, the chunk and this sampler's counters (``lag``: of the
        last chunk drawn)."""
        return {**self.prompts.stats(), "epoch": self.epoch, "chunk": self.chunk, **self.counters}

    # ------------------------------------------------------------------ checkpoint
    def _config(self) -> dict:
        return {"num_generations": self.num_generations, "repeat_count": self.repeat_count,
                "num_batches": self.num_batches, "max_lag": self.max_lag}

    @property
    def yielded(self) -> int:
        """Indices handed out since this sampler was built (restored with its state): every chunk drawn is handed
        out whole, except the current one, of which ``offset`` indices are."""
        left = self.chunk_length - self.offset if self.batch is not None else 0
        return self.counters["chunks_drawn"] * self.chunk_length - left

    def state_dict(self, *, unconsumed: int = 0) -> dict:
        """The prompt sampler's state and the position in the epoch and in the current chunk (mid-epoch too).

        ``unconsumed``: the last indices handed out that the trainer never received (a DataLoader's read-ahead,
        lost when the process stops): the state says they were not handed out yet, so a restored sampler hands
        them out again, in the same chunk, without drawing it again. They must lie in the current chunk (at most
        its ``offset``): a chunk before it is gone, and the records and generator stay as they are (the feedback
        given since that chunk was drawn is kept, as in an uninterrupted run)."""
        offset = self.offset if self.batch is not None else 0
        unconsumed = checks.integer("unconsumed", unconsumed, 0, offset,
                                    why="only indices of the current chunk can be handed out again")
        offset -= unconsumed
        batch = self.batch
        # a chunk whose last index was handed out is done, though its iterator has not yet been asked for more
        if offset == self.chunk_length:
            batch, offset = None, 0
        return {"version": STATE_VERSION, "config": self._config(), "prompts": self.prompts.state_dict(),
                "epoch": self.epoch, "chunk": self.chunk, "offset": offset,
                **PromptBatch.fields(batch), "counters": dict(self.counters)}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore a `state_dict`: the next index is the one that would have followed. Checked first
        (`InvalidState` names the bad field; nothing changes). Under DDP a collective: every rank raises if any
        rank cannot load it."""
        if self.world is None:
            self._load(state)
            return
        self.world.agree(lambda: self._load(state), "load_state_dict")
        digests = self.world.all_gather_objects(state_digest(self.state_dict()))
        if len(set(digests)) > 1:
            raise RuntimeError("the ranks loaded different prompt sampler states; load the same state on every rank")

    def _load(self, state: Mapping) -> None:
        where = check_header(state, STATE_VERSION, self._config(), "GRPO prompt sampler")
        epoch = integer(state, "epoch", where, 0)
        chunk = integer(state, "chunk", where, 0, self.num_batches)
        offset = integer(state, "offset", where, 0, self.chunk_length - 1)
        batch = PromptBatch.read_fields(state, where, size=self.prompts.batch_size, offset=offset, started=chunk,
                                        num_prompts=self.prompts.num_prompts, unit="chunk")
        counts = counters(state, "counters", where, self.counters)
        self.prompts.load_state_dict(field(state, "prompts", where))  # checks all of its state before it changes
        # Everything is checked: from here on nothing can fail.
        self.epoch, self.chunk, self.offset, self.counters = epoch, chunk, offset, counts
        self.batch = batch
