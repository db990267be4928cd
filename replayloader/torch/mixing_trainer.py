"""MixingTrainer: a Hugging Face `Trainer` whose training batches come from a `MixtureSampler`, whose per-source
training loss moves the mixture, and whose checkpoints hold the sampler.

Optional module (needs torch, transformers and accelerate); ``replayloader.mixing.hf`` until 1.1 (that path still
imports, with a DeprecationWarning). Public Trainer hooks only, no patching:

- `get_train_dataloader` builds the train DataLoader around a `MixtureBatchSampler`, over the training set with
  an ``index`` field added to every example (`WithIndex`), so each batch says which dataset examples it holds;
- `compute_loss` pops ``index`` (and ``labels``) before the model call, computes the per-example loss, feeds
  it back (`MixtureBatchSampler.feedback`, a collective under DDP) and returns its mean;
- `train(resume_from_checkpoint=...)` restores the sampler from the checkpoint folder before training
  resumes, and a callback (`on_save`) writes it into every checkpoint folder (``mixture_sampler.npz``, one
  file for all ranks). The Trainer must not skip batches on resume (the sampler resumes its own stream), so
  ``args.ignore_data_skip`` is set to True.

Prefetch lag: with one process, Accelerate's DataLoader wrapper fetches one batch ahead of the one being
trained on, and workers fetch ``num_workers × prefetch_factor`` ahead; a batch's mixture reflects the feedback
up to that many steps before it. Under several processes (torchrun, accelerate launch) the loader is not passed
through ``accelerator.prepare`` (its batch-sampler sharding would hand each process other batches than the
ones the sampler sliced for it); the Trainer moves each batch to the device itself.

Evaluation is unchanged (an eval batch has no ``index``; the model is not in training mode there).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset
from transformers import Trainer

from ..distributed.launcher import fork_safe_context
from ..mixing.sampler import MixtureSampler
from .hf import SaveStateEachCheckpoint, checkpoint_state, cross_entropy_per_example
from .mixing import MixtureBatchSampler

INDEX = "index"  # the field every training example gets: its dataset index
STATE_FILE = "mixture_sampler.npz"  # the sampler's file in a checkpoint folder
PerExampleLoss = Callable[[Any, torch.Tensor], torch.Tensor]


def causal_lm_per_example_loss(outputs: Any, labels: torch.Tensor) -> torch.Tensor:
    """Per-example mean next-token cross-entropy of a causal LM's ``outputs.logits`` (labels shifted by one,
    positions labelled -100 ignored, as the models' own loss); shape (batch,)."""
    logits = outputs.logits[:, :-1].float()
    targets = labels[:, 1:]
    tokens = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none",
                             ignore_index=-100).view(targets.shape)
    counted = (targets != -100).sum(1)
    return tokens.sum(1) / counted.clamp(min=1)


class WithIndex(Dataset):
    """A map-style dataset of dict examples, each with its index added as ``index`` (how a training batch says
    which examples it holds). An example that already has an ``index`` must carry its own index there."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> dict:
        example = self.dataset[i]
        if not isinstance(example, Mapping):
            raise TypeError(f"MixingTrainer needs examples that are dicts (it adds {INDEX!r}), got "
                            f"{type(example).__name__}")
        if INDEX in example and int(example[INDEX]) != i:
            raise ValueError(f"example {i} already has a field {INDEX!r} = {example[INDEX]!r}, which MixingTrainer "
                             f"uses for the dataset index; rename it")
        return {**example, INDEX: i}


class MixingTrainer(Trainer):
    """`Trainer` with mixture batches; ``sampler.batch_size`` (the global batch) replaces the per-device batch.

    Args (besides the Trainer's): ``sampler``, the `MixtureSampler` over ``train_dataset`` (its examples must be
    dicts; `concat_sources` builds both from K datasets); ``per_example_loss(outputs, labels) -> (batch,)``
    (default: cross-entropy of a classification head's ``outputs.logits``; `causal_lm_per_example_loss` for a
    causal LM), whose detached value is the feedback and whose mean is the training loss; ``num_batches``, the
    batches of one Trainer epoch (`MixtureBatchSampler`'s).
    """

    def __init__(self, *args: Any, sampler: MixtureSampler,
                 per_example_loss: PerExampleLoss = cross_entropy_per_example, num_batches: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(sampler, MixtureSampler):
            raise TypeError(f"sampler must be a MixtureSampler, got {type(sampler).__name__}")
        size = None if self.train_dataset is None else len(self.train_dataset)
        if size is not None and size != sampler.num_examples:
            raise ValueError(f"the sampler covers {sampler.num_examples} examples but train_dataset has {size}")
        self.distributed = self.accelerator.num_processes > 1
        self.batch_sampler = MixtureBatchSampler(sampler, num_batches=num_batches)  # DDP: checks every rank's
        self.per_example_loss = per_example_loss
        self.model_accepts_loss_kwargs = False  # compute_loss returns a per-batch mean
        self.args.ignore_data_skip = True  # the sampler resumes its own stream: skipping would draw batches again
        self.add_callback(SaveStateEachCheckpoint(self.batch_sampler.state_dict, STATE_FILE))

    def get_train_dataloader(self) -> DataLoader:
        dataset = self.train_dataset
        if self.args.remove_unused_columns and hasattr(dataset, "column_names"):  # a `datasets.Dataset`
            dataset = self._remove_unused_columns(dataset, description="training")  # as the Trainer's own loader
        workers = self.args.dataloader_num_workers
        loader = DataLoader(WithIndex(dataset), batch_sampler=self.batch_sampler, collate_fn=self.data_collator,
                            num_workers=workers, pin_memory=self.args.dataloader_pin_memory,
                            multiprocessing_context=fork_safe_context(workers))
        return loader if self.distributed else self.accelerator.prepare(loader)  # see the module doc

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not model.training or INDEX not in inputs:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        inputs = dict(inputs)
        index = inputs.pop(INDEX)
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        per_example = self.per_example_loss(outputs, labels)
        batch = self.batch_sampler.next_batch_info()
        if not np.array_equal(batch.indices, index.detach().cpu().numpy()):
            raise RuntimeError("the batch the Trainer trains on is not the next one the mixture handed out (a "
                               "DataLoader with in_order=False, or batches skipped outside the sampler?)")
        self.batch_sampler.feedback(batch, loss=per_example.detach())
        loss = per_example.mean()
        return (loss, outputs) if return_outputs else loss

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs: Any):
        """`Trainer.train`; resuming also restores the sampler from the checkpoint's ``mixture_sampler.npz``."""
        resume_from_checkpoint, state = checkpoint_state(self.args.output_dir, resume_from_checkpoint, STATE_FILE,
                                                         "MixingTrainer")
        if state is not None:
            self.batch_sampler.load_state_dict(state)
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)
