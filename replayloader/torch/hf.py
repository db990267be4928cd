"""PrioritizedTrainer: a Hugging Face `Trainer` whose training batches come from a `PrioritizedSampler`;
SelectingTrainer: one that scores candidate batches and trains on the rows a `Selector` picks.

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

from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader
from transformers import Trainer, TrainerCallback

from ..distributed.sampler import DistributedPrioritizedSampler, check_dataset_size
from ..distributed.launcher import fork_safe_context
from ..sampler.prioritized import PrioritizedSampler
from ..selection.rules import Selection, Selector
from .batch_sampler import PrioritizedBatchSampler
from .candidates import CandidateBatchSampler, take_rows

PerExampleLoss = Callable[[Any, torch.Tensor], torch.Tensor]


def cross_entropy_per_example(outputs: Any, labels: torch.Tensor) -> torch.Tensor:
    """Per-example cross-entropy of a classification head's ``outputs.logits``; shape (batch,)."""
    return F.cross_entropy(outputs.logits.float(), labels, reduction="none")


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


class SelectingTrainer(PrioritizedTrainer):
    """`Trainer` that scores each candidate batch and trains on the rows a `Selector` picks (score-then-select).

    The train DataLoader yields candidate batches of ``sampler.batch_size`` = n_B rows. `compute_loss` scores
    them with one forward pass under ``torch.no_grad`` (in eval mode when ``score_in_eval_mode``: no dropout
    noise in the scores and no batch-norm statistics moved by a pass that does not train), lets the selector pick
    the rows (the scores also refresh the sampler's weights), and returns the importance-weighted mean loss of a
    forward pass over the chosen rows. Per step: one no-grad forward over n_B, one forward + backward over n_b.

    Args (besides the Trainer's): ``sampler`` (n_B, and how candidates are drawn: ``alpha=0`` for uniform),
    ``selector`` (`Selector(TopK(n_b))`, ...), ``per_example_loss`` as for `PrioritizedTrainer`,
    ``score_in_eval_mode`` (default True). ``trainer.batch_sampler`` is a
    `replayloader.torch.candidates.CandidateBatchSampler`; its ``state_dict()`` holds sampler and selector.

    Several processes: n_B and n_b are global; each process fetches and scores n_B / W candidates and trains
    n_b / W of its own (`replayloader.distributed.select`), so the selector's k must divide by W.
    """

    def __init__(self, *args: Any, sampler: PrioritizedSampler, selector: Selector,
                 per_example_loss: PerExampleLoss = cross_entropy_per_example, score_in_eval_mode: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(*args, sampler=sampler, per_example_loss=per_example_loss, **kwargs)
        # the sampler as PrioritizedTrainer set it up: under several processes, the distributed one
        self.batch_sampler = CandidateBatchSampler(self.batch_sampler.sampler, selector)
        self.score_in_eval_mode = score_in_eval_mode
        self.last_selection: Selection | None = None

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not model.training:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        inputs = dict(inputs)
        labels = inputs.pop("labels")
        with torch.no_grad():
            if self.score_in_eval_mode:
                model.eval()
            try:
                scores = self.per_example_loss(model(**inputs), labels)
            finally:
                model.train()
        candidates = self.batch_sampler.next_batch_info()
        selection = self.batch_sampler.choose(candidates, scores)
        self.last_selection = selection
        chosen = take_rows(inputs, selection.positions)
        outputs = model(**chosen)
        per_example = self.per_example_loss(outputs, take_rows(labels, selection.positions))
        weights = torch.as_tensor(selection.weights, dtype=per_example.dtype, device=per_example.device)
        loss = (per_example * weights).mean()
        return (loss, outputs) if return_outputs else loss
