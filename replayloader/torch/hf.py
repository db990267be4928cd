"""PrioritizedTrainer: a Hugging Face `Trainer` whose training batches come from a `PrioritizedSampler`;
SelectingTrainer: one that scores candidate batches and trains on the rows a `Selector` picks (also a
`SelectionSwitch`, whose uniform steps score nothing, a `ReusedPool`, whose pool feeds m steps, and a
`ProxyScorer` in the model's place for the scoring).

Optional module (needs torch, transformers and accelerate). Two overrides, both public Trainer hooks:
`get_train_dataloader` builds the train DataLoader around a `PrioritizedBatchSampler`, and `compute_loss`
computes the per-example loss, feeds it back to the sampler, and returns its importance-weighted mean.
Evaluation is untouched (the model is not in training mode there).

Several processes (torchrun, accelerate launch): the sampler becomes a `DistributedPrioritizedSampler` (its
``batch_size`` is the global batch, each process trains batch_size / world_size examples a step), and the train
DataLoader is NOT passed through ``accelerator.prepare``: Accelerate would wrap the batch sampler in its
``BatchSamplerShard`` and hand each process every W-th batch of its own sampler, so the indices and importance
weights popped for the loss and the feedback would belong to another batch (issue 23). The Trainer moves each
batch to the device itself (``_prepare_inputs``).

Resuming a Trainer checkpoint restores the model and optimizer, not the sampler: save
``trainer.batch_sampler.state_dict()`` yourself (on several processes: ``save_shared_state(...)`` on every rank,
one file) and pass ``ignore_data_skip=True`` (the sampler already knows where its epoch stands, so the Trainer
must not skip batches again).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from ..distributed.sampler import DistributedPrioritizedSampler, check_dataset_size
from ..distributed.state_files import load_shared_state, save_shared_state
from ..distributed.launcher import fork_safe_context
from ..sampler.prioritized import PrioritizedSampler, SampledBatch
from ..selection.rules import Selection, Selector
from ..state.checks import array, field, require
from .batch_sampler import PrioritizedBatchSampler
from .candidates import CandidateBatchSampler, take_rows

PerExampleLoss = Callable[[Any, torch.Tensor], torch.Tensor]


def cross_entropy_per_example(outputs: Any, labels: torch.Tensor) -> torch.Tensor:
    """Per-example cross-entropy of a classification head's ``outputs.logits``; shape (batch,)."""
    return F.cross_entropy(outputs.logits.float(), labels, reduction="none")


class SaveStateEachCheckpoint(TrainerCallback):
    """Write a sampler's state into each checkpoint folder the Trainer saves, as ``file_name``: a collective
    under DDP (every rank calls it, rank 0 writes), read back with `load_shared_state`. Why a callback: the
    Trainer knows its own checkpoint folder only when it saves, and a sampler's state must sit beside the
    model's to resume the identical stream."""

    def __init__(self, state: Callable[[], dict], file_name: str) -> None:
        self.state, self.file_name = state, file_name

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        save_shared_state(self.state(), folder / self.file_name)


def checkpoint_state(output_dir: str, resume_from_checkpoint: str | bool | None, file_name: str,
                     writer: str) -> tuple[str | bool | None, dict | None]:
    """The pair a Trainer adapter's ``train`` needs when it resumes: ``resume_from_checkpoint`` resolved as the
    Trainer resolves it (``True``: the last checkpoint in ``output_dir``, or ``True`` again when there is none,
    for the Trainer's own error), and the sampler state `SaveStateEachCheckpoint` wrote there as ``file_name``
    (None when not resuming). A checkpoint without that file was not written by ``writer``: refused by name."""
    if resume_from_checkpoint is True:
        resume_from_checkpoint = get_last_checkpoint(output_dir) or True
    if not isinstance(resume_from_checkpoint, (str, Path)):
        return resume_from_checkpoint, None
    path = Path(resume_from_checkpoint) / file_name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the checkpoint was not written by a {writer}, so the sampler "
                                f"cannot resume its stream")
    return str(resume_from_checkpoint), load_shared_state(path)


class _SettleAtTrainEnd(TrainerCallback):
    """The last step's feedback, still in flight under several processes, is applied when training ends."""

    def __init__(self, batches: PrioritizedBatchSampler) -> None:
        self.batches = batches

    def on_train_end(self, args, state, control, **kwargs):
        self.batches.settle()


class PrioritizedTrainer(Trainer):
    """`Trainer` with prioritized training batches; ``sampler.batch_size`` replaces the per-device batch size.

    Args (besides the Trainer's): ``sampler``, the `PrioritizedSampler` over ``train_dataset``;
    ``per_example_loss(outputs, labels) -> (batch,)`` (default: cross-entropy of ``outputs.logits``), whose
    detached value is the feedback (``loss=``) and whose importance-weighted mean is the training loss.
    """

    def __init__(self, *args: Any, sampler: PrioritizedSampler,
                 per_example_loss: PerExampleLoss = cross_entropy_per_example, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        size = None if self.train_dataset is None else len(self.train_dataset)
        self.distributed = self.accelerator.num_processes > 1
        if self.distributed:  # checks the dataset size on every rank, so a mismatch on one rank stops them all
            # the feedback's gather, started in compute_loss, runs during the backward pass
            sampler = DistributedPrioritizedSampler(sampler, dataset_size=size, overlap=True)
        else:
            check_dataset_size(sampler, size)
        self.batch_sampler = PrioritizedBatchSampler(sampler)
        self.add_callback(_SettleAtTrainEnd(self.batch_sampler))
        self.per_example_loss = per_example_loss
        # compute_loss returns a per-batch mean: the Trainer must divide it by the accumulation steps itself
        self.model_accepts_loss_kwargs = False

    def get_train_dataloader(self) -> DataLoader:
        dataset = self.train_dataset
        if self.args.remove_unused_columns and hasattr(dataset, "column_names"):  # a `datasets.Dataset`
            dataset = self._remove_unused_columns(dataset, description="training")  # as the Trainer's own loader
        loader = DataLoader(dataset, batch_sampler=self.batch_sampler, collate_fn=self.data_collator,
                            num_workers=self.args.dataloader_num_workers, pin_memory=self.args.dataloader_pin_memory,
                            multiprocessing_context=fork_safe_context(self.args.dataloader_num_workers))
        return loader if self.distributed else self.accelerator.prepare(loader)  # see the module doc

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not model.training:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        inputs = dict(inputs)
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        per_example = self.per_example_loss(outputs, labels)
        batch = self.batch_sampler.next_batch_info()
        self.batch_sampler.feedback(batch, loss=per_example.detach())
        loss = (per_example * self.batch_sampler.importance_weights(batch, per_example)).mean()
        return (loss, outputs) if return_outputs else loss


# ---------------------------------------------------------------------------------------------------- selection
# What kind of selector or scorer the trainer got is judged one way, by these Protocols (a `runtime_checkable`
# isinstance: every member present), so a user's own ReusedPool-, switch- or scorer-like object qualifies by what
# it has, not by its class.
@runtime_checkable
class ReusedPoolLike(Protocol):
    """What `SelectingTrainer` needs of a selector that feeds m steps per scored pool (`ReusedPool`)."""

    steps_per_pool: int

    @property
    def pending_steps(self) -> int: ...

    def next_step(self, *, rank: int = 0, world_size: int = 1) -> Selection: ...

    def candidate_indices(self, rank: int = 0) -> np.ndarray: ...


@runtime_checkable
class SwitchLike(Protocol):
    """What `SelectingTrainer` needs of a selector that decides per step whether to score (`SelectionSwitch`)."""

    @property
    def selecting(self) -> bool: ...

    def uniform(self, candidates: Any, *, rows: int | None = None) -> Selection: ...

    def step_done(self, losses: Any = None, *, indices: Any = None, seconds: float | None = None) -> None: ...


@runtime_checkable
class ScorerLike(Protocol):
    """What `SelectingTrainer` needs of a ``scorer`` (`replayloader.torch.ProxyScorer`)."""

    def score(self, candidates: Any, indices: Any = None) -> torch.Tensor: ...

    def feedback(self, candidates: Any, *, positions: Any = None, main_losses: Any = None, weights: Any = None,
                 indices: Any = None) -> float: ...


@dataclass
class PoolStep:
    """One yield of `PooledCandidateBatchSampler`: step ``step`` of ``steps`` of the pool drawn as ``batch``;
    ``whole``: the DataLoader fetched the whole pool (its first step, or the first after a resume), else one
    placeholder row (the trainer holds the pool's rows)."""

    batch: SampledBatch
    step: int
    steps: int
    whole: bool = True


class PooledCandidateBatchSampler(CandidateBatchSampler):
    """`CandidateBatchSampler` for a `ReusedPool` in `SelectingTrainer`: one DataLoader item per training step.

    Each candidate pool is yielded whole for its first step; each of its other steps yields a one-row placeholder
    (the pool's first candidate), and the trainer trains on the pool it keeps in memory, so the pool is fetched
    once. A later step is yielded whole again only when the trainer does not hold the pool: the first step after
    `load_state_dict` (the pool's rows are fetched again by index). A new ``iter()`` yields first what was drawn
    and not received yet (nothing drawn is dropped).

    Each ``iter()`` yields ``len()`` steps: the sampler's batches per epoch times m, drawing on into the sampler's
    next epoch where needed (a short last pool of a warm-up pass gives fewer than m steps). So a Trainer epoch is
    always ``len()`` steps, and a pool may straddle two Trainer epochs; `set_epoch` does nothing (the sampler
    counts its own epochs). One process.

    Exact resume: ``state_dict()`` holds the sampler, every step drawn but not trained yet (``pending``: the
    DataLoader's prefetched items and the rest of the pool being handed out; ``pool_steps``: each one's
    [step, steps of its pool]) and the `ReusedPool` (its scores, plan and how many steps it handed out). After
    ``load_state_dict`` the next ``iter()`` yields those steps first, then draws on.
    """

    def __init__(self, sampler: PrioritizedSampler, selector: Selector, *, refresh: bool = True) -> None:
        if not isinstance(selector, ReusedPoolLike):
            raise TypeError(f"selector must feed several steps per pool (a ReusedPool), got {type(selector).__name__}")
        if isinstance(sampler, DistributedPrioritizedSampler):
            raise ValueError("PooledCandidateBatchSampler runs in one process: under several processes take the "
                             "pool's steps in a DataLoader loop (CandidateBatchSampler, pool.steps(first, rank=, "
                             "world_size=))")
        super().__init__(sampler, selector, refresh=refresh)
        self.pool = selector
        # the queue (`records.RecordedBatchSampler`) holds PoolSteps: those yielded and not received by the
        # trainer yet, then those drawn and not yielded yet (the rest of the pool being handed out)
        self._held_pool: int | None = None  # the pool (its draw's step number) the trainer last received whole

    def __len__(self) -> int:
        return len(self.sampler) * self.pool.steps_per_pool

    def steps_of(self, candidates: int) -> int:
        """The training steps a pool of ``candidates`` rows gives: m, or fewer for a short pool (ceil(n / n_b))."""
        return min(self.pool.steps_per_pool, -(-candidates // self.pool.rule.k))

    def __iter__(self) -> Iterator[list[int]]:
        # steps drawn before (yielded to an iterator that was dropped, or loaded from a state) come first
        self._restart(keep_handed=True)
        held = self._held_pool  # the pool the trainer holds; then the one this iterator yielded whole last
        for _ in range(len(self)):
            if not self._waiting:
                batch = self.sampler.next_batch()
                count = self.steps_of(len(batch))
                self._waiting.extend(PoolStep(batch, j, count) for j in range(count))
            step = self._hand_out(self._waiting.popleft())
            step.whole = step.step == 0 or step.batch.step != held
            if step.whole:
                held = step.batch.step
            indices = step.batch.indices
            yield (indices if step.whole else indices[:1]).tolist()

    def next_pool_step(self) -> PoolStep:
        """The `PoolStep` of the next item the DataLoader returns, oldest first (once per item received)."""
        step = self._pop_received("next_pool_step()")
        if step.whole:
            self._held_pool = step.batch.step
        return step

    def next_batch_info(self) -> SampledBatch:
        """The candidate batch (the pool) of the next item the DataLoader returns; see `next_pool_step`."""
        return self.next_pool_step().batch

    def set_epoch(self, epoch: int) -> None:
        """Nothing to do: a Trainer epoch is ``len()`` steps, and the sampler counts its own epochs."""

    def state_dict(self) -> dict:
        """The sampler, every step drawn but not trained yet (``pending`` / ``pool_steps``) and the `ReusedPool`."""
        steps = self._pending()
        pending = [{"indices": s.batch.indices.copy(), "weights": s.batch.weights.copy(),
                    "probabilities": s.batch.probabilities.copy(), "epoch": s.batch.epoch, "step": s.batch.step}
                   for s in steps]
        return {"sampler": self.sampler.state_dict(), "pending": pending,
                "pool_steps": np.array([[s.step, s.steps] for s in steps], np.int64).reshape(-1, 2),
                "selector": self.select.selector.state_dict()}

    def load_state_dict(self, state: Mapping) -> None:
        """All or nothing: the pending steps are checked, then sampler and `ReusedPool` load together."""
        where = "pool batch sampler state"
        pending = field(state, "pending", where)
        require(isinstance(pending, list), f"{where}['pending'] must be a list, got {type(pending).__name__}")
        pairs = array(state, "pool_steps", where, (len(pending), 2), "iu", np.int64)
        m = self.pool.steps_per_pool
        bad = np.flatnonzero((pairs[:, 0] < 0) | (pairs[:, 0] >= pairs[:, 1]) | (pairs[:, 1] > m))
        require(not len(bad), f"{where}['pool_steps'][{bad[0] if len(bad) else 0}] must be [step, steps] with "
                              f"0 <= step < steps <= m = {m}")
        super().load_state_dict(state)
        self._load_pending([PoolStep(batch, int(step), int(steps)) for batch, (step, steps) in zip(self._waiting,
                                                                                                   pairs)])
        self._held_pool = None  # nothing is in the trainer's memory: a pool in progress is fetched again


@dataclass
class _Chosen:
    """What a step trains on: the selection, the batch its positions index, and what ends the step (called by
    `training_step` with the trained rows' per-example losses and the step's seconds, or None)."""

    selection: Selection
    inputs: dict
    labels: Any
    end: Callable[[torch.Tensor, float | None], None] | None = None


class SelectingTrainer(PrioritizedTrainer):
    """`Trainer` that scores each candidate batch and trains on the rows a `Selector` picks (score-then-select).

    The train DataLoader yields candidate batches of ``sampler.batch_size`` = n_B rows. `compute_loss` scores
    them with one forward pass under ``torch.no_grad`` (in eval mode when ``score_in_eval_mode``: no dropout
    noise in the scores and no batch-norm statistics moved by a pass that does not train), lets the selector pick
    the rows (the scores also refresh the sampler's weights), and returns the importance-weighted mean loss of a
    forward pass over the chosen rows. Per step: one no-grad forward over n_B, one forward + backward over n_b.

    Args (besides the Trainer's): ``sampler`` (n_B, and how candidates are drawn: ``alpha=0`` for uniform),
    ``selector`` (`Selector(TopK(n_b))`, ...), ``per_example_loss`` as for `PrioritizedTrainer`,
    ``score_in_eval_mode`` (default True; the model's scoring pass only), ``scorer``: a
    `replayloader.torch.ProxyScorer` that scores the candidates in the model's place (``scorer.score((inputs,
    labels), indices)``, ``inputs`` the batch without ``labels``) and learns, one ``feedback`` per training step,
    from the rows the model trained on. ``trainer.batch_sampler`` is a
    `replayloader.torch.candidates.CandidateBatchSampler`; its ``state_dict()`` holds sampler and selector.

    The selector decides, once, how a step chooses its rows (one code path per kind, picked here):

    - a `Selector`: score every candidate batch, choose.
    - a `SelectionSwitch` (anything with ``selecting``, ``uniform``, ``step_done``): a selection step scores and
      chooses; a uniform step trains n_b uniform rows of the fetched batch (``switch.uniform``) with no scoring
      forward, and `training_step` ends every step with ``step_done`` (the uniform rows' training losses; with
      ``cost="seconds"`` the step's seconds: `training_step`'s, after a device synchronize on CUDA).
    - a `ReusedPool` (anything with ``next_step``, ``pending_steps``, ...): one scored pool feeds its m steps.
      ``trainer.batch_sampler`` is then a `PooledCandidateBatchSampler`: the DataLoader fetches each pool once
      and a one-row placeholder for each further step, the trainer keeps the pool's rows in memory for its steps.
      A checkpoint taken mid-pool resumes exactly (the batch sampler's state holds the steps left; the pool's
      rows are fetched again by index). A step is a micro-batch: with ``gradient_accumulation_steps`` g, m steps
      are m micro-batches.

    Several processes: n_B and n_b are global; each process fetches and scores n_B / W candidates and trains
    n_b / W of its own (`replayloader.distributed.select`), so the selector's k must divide by W. There a
    `SelectionSwitch` scores every candidate batch (a uniform window takes uniform rows of the scored pool) and
    takes ``cost="rows"`` only; a `ReusedPool` is refused (take its steps in a DataLoader loop).

    Checkpoints: save ``trainer.batch_sampler.state_dict()`` with each Trainer checkpoint (a ``TrainerCallback``'s
    ``on_save``), load it into the new trainer's ``batch_sampler`` before ``train(resume_from_checkpoint=...)`` and
    pass ``ignore_data_skip=True``; a ``scorer`` checkpoints itself (its ``state_dict()``).
    """

    def __init__(self, *args: Any, sampler: PrioritizedSampler, selector: Selector,
                 per_example_loss: PerExampleLoss = cross_entropy_per_example, score_in_eval_mode: bool = True,
                 scorer: ScorerLike | None = None, **kwargs: Any) -> None:
        pool, switch = isinstance(selector, ReusedPoolLike), isinstance(selector, SwitchLike)
        if pool and switch:
            raise TypeError(f"{type(selector).__name__} looks like both a ReusedPool (next_step, pending_steps) and "
                            f"a SelectionSwitch (selecting, uniform, step_done); SelectingTrainer takes one of them")
        if scorer is not None and not isinstance(scorer, ScorerLike):
            raise TypeError(f"scorer must score candidates in the model's place (a ProxyScorer: score, feedback), got "
                            f"{type(scorer).__name__}")
        super().__init__(*args, sampler=sampler, per_example_loss=per_example_loss, **kwargs)
        inner = self.batch_sampler.sampler  # as PrioritizedTrainer set it up: under several processes, the DDP one
        self.timed = switch and getattr(selector, "cost", "rows") == "seconds"
        if self.distributed and self.timed:
            raise ValueError("a SelectionSwitch with cost='seconds' needs the same seconds on every rank; under "
                             "several processes SelectingTrainer takes cost='rows'")
        if pool:
            if self.distributed:
                raise ValueError("SelectingTrainer takes a ReusedPool in one process only: under several processes "
                                 "take the pool's steps in a DataLoader loop (CandidateBatchSampler, "
                                 "pool.steps(first, rank=rank, world_size=W))")
            self.batch_sampler = PooledCandidateBatchSampler(inner, selector)
            self.choose_rows = self._pool_rows
        else:
            self.batch_sampler = CandidateBatchSampler(inner, selector)
            self.choose_rows = self._switch_rows if switch and not self.distributed else self._scored_rows
        self.selector, self.scorer = selector, scorer
        self.score_in_eval_mode = score_in_eval_mode
        self.last_selection: Selection | None = None
        self._held: tuple[int, dict, Any] | None = None  # a pool's rows in memory: (its draw's step, inputs, labels)
        self._ending: tuple[Callable, torch.Tensor] | None = None  # the step's end, called by training_step

    # ------------------------------------------------------------------ the ways to choose a step's rows
    def _scores(self, model, inputs: dict, labels: Any, candidates: SampledBatch) -> Any:
        """Every candidate's score: the scorer's, or one no-grad forward of the model."""
        if self.scorer is not None:
            return self.scorer.score((inputs, labels), candidates.indices)
        with torch.no_grad():
            if self.score_in_eval_mode:
                model.eval()
            try:
                return self.per_example_loss(model(**inputs), labels)
            finally:
                model.train()

    def _scored_rows(self, model, inputs: dict, labels: Any) -> _Chosen:
        """Score the candidate batch, let the selector choose."""
        candidates = self.batch_sampler.next_batch_info()
        return _Chosen(self.batch_sampler.choose(candidates, self._scores(model, inputs, labels, candidates)), inputs,
                       labels)

    def _switch_rows(self, model, inputs: dict, labels: Any) -> _Chosen:
        """A selection step scores and chooses; a uniform step takes the switch's uniform rows, nothing scored."""
        switch = self.selector
        candidates = self.batch_sampler.next_batch_info()
        if switch.selecting:
            selection = self.batch_sampler.choose(candidates, self._scores(model, inputs, labels, candidates))
            return _Chosen(selection, inputs, labels, lambda losses, seconds: switch.step_done(seconds=seconds))
        selection = switch.uniform(candidates)
        return _Chosen(selection, inputs, labels, lambda losses, seconds: switch.step_done(losses, seconds=seconds))

    def _pool_rows(self, model, inputs: dict, labels: Any) -> _Chosen:
        """A pool's first step scores the pool and keeps its rows; the others take ``next_step()`` from them."""
        step = self.batch_sampler.next_pool_step()
        if step.whole:
            if step.step and not np.array_equal(self.selector.candidate_indices(), step.batch.indices):
                raise RuntimeError("the pool fetched again is not the ReusedPool's current pool (a batch sampler "
                                   "state loaded without its selector, or a pool advanced outside the trainer?)")
            self._held = (step.batch.step, inputs, labels)
        if self._held is None or self._held[0] != step.batch.step:
            raise RuntimeError(f"step {step.step} of a pool came without the pool's rows in memory (the trainer "
                               f"received the DataLoader's items out of order?)")
        _, pool_inputs, pool_labels = self._held
        if step.step == 0:
            selection = self.batch_sampler.choose(step.batch, self._scores(model, inputs, labels, step.batch))
            if self.selector.pending_steps + 1 != step.steps:
                raise RuntimeError(f"the ReusedPool planned {self.selector.pending_steps + 1} steps for this pool but "
                                   f"the batch sampler yields {step.steps}")
        else:
            selection = self.selector.next_step()
        if step.step == step.steps - 1:
            self._held = None  # the pool's last step: its rows are let go after this step
        return _Chosen(selection, pool_inputs, pool_labels)

    # ------------------------------------------------------------------ the step
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not model.training:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        inputs = dict(inputs)
        labels = inputs.pop("labels")
        chosen = self.choose_rows(model, inputs, labels)
        selection = self.last_selection = chosen.selection
        outputs = model(**take_rows(chosen.inputs, selection.positions))
        per_example = self.per_example_loss(outputs, take_rows(chosen.labels, selection.positions))
        if self.scorer is not None:  # the scorer learns the rows the model trains on
            train_on_rows = getattr(self.scorer, "train_on", "selected") == "selected"
            self.scorer.feedback((chosen.inputs, chosen.labels), positions=selection.positions,
                                 main_losses=per_example.detach(), indices=selection.indices,
                                 weights=selection.weights if train_on_rows else None)
        if chosen.end is not None:
            self._ending = (chosen.end, per_example.detach())
        weights = torch.as_tensor(selection.weights, dtype=per_example.dtype, device=per_example.device)
        loss = (per_example * weights).mean()
        return (loss, outputs) if return_outputs else loss

    def training_step(self, model, inputs, *args: Any, **kwargs: Any) -> torch.Tensor:
        """`Trainer.training_step`; then the step's end (a `SelectionSwitch`'s ``step_done``)."""
        start = self._clock() if self.timed else None
        self._ending = None
        loss = super().training_step(model, inputs, *args, **kwargs)
        if self._ending is not None:
            end, losses = self._ending
            self._ending = None
            end(losses, None if start is None else self._clock() - start)
        return loss

    def _clock(self) -> float:
        if self.args.device.type == "cuda":
            torch.cuda.synchronize(self.args.device)
        return time.perf_counter()
