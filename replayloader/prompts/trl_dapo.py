"""DynamicSamplingGRPOTrainer: TRL's ``GRPOTrainer`` with DAPO's dynamic sampling, the baseline a prompt sampler
has to beat in seconds.

Optional module (needs trl: ``pip install replayloader[trl]``). TRL has no dynamic sampling (huggingface/trl
#3708); DAPO's reference (verl's ``recipe/dapo/dapo_ray_trainer.py``, ``RayDAPOTrainer.fit``) generates a batch,
drops the groups whose rewards have zero variance, and generates again until the training batch holds
``train_batch_size`` groups with signal, trimming the surplus; after ``max_num_gen_batches`` generations it gives up
with an error. This trainer does the same inside TRL's one hook that sees a whole generation batch:

- **Where.** `_generate_and_score_completions`, in training: it ignores the prompts the DataLoader read and draws
  its own from a `DynamicSampling` (shuffled passes over the prompts, ``oversample`` times the groups still
  missing), generates and scores them with TRL's own code, keeps the groups `DynamicSampling.feedback` keeps, and
  repeats until the batch is full. The kept rows, in generation order, become TRL's generation batch (the same
  dictionary TRL builds, with prompts and completions re-padded to the longest kept row and
  ``num_items_in_batch`` recounted over the kept tokens), so the loss, ``steps_per_generation`` slicing and
  ``num_iterations`` reuse work unchanged. Evaluation is TRL's.
- **What it costs.** Every generated group, dropped or trimmed, was generated and scored: that is the price of the
  method, and it stays on the clock. TRL's metrics (``frac_reward_zero_std``, rewards) are logged once per round,
  over every group generated; ``dynamic/rounds`` and ``dynamic/frac_dropped`` say what the filter did.
- **Checkpoints.** The `DynamicSampling` state goes into every checkpoint folder (``dynamic_sampling.npz``) and
  `train(resume_from_checkpoint=...)` restores it. Save at generation boundaries (TRL regenerates a batch it was
  reusing when it resumes mid-cycle, and that regeneration draws new prompts).
- **One process.** Under several processes each would keep a different number of rows, and DDP needs equal
  batches; verl gathers the batch on one controller, TRL does not. Several processes are refused.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from trl import GRPOTrainer

from ..torch.hf import SaveStateEachCheckpoint, checkpoint_state
from .baselines import DynamicSampling
from .trl import feedback_column, feedback_values, fitted_sampler

STATE_FILE = "dynamic_sampling.npz"  # the sampler's file in a checkpoint folder
WARN_EVERY = 100  # rounds of one batch between warnings when max_rounds is None (it may never fill)
LEFT_PADDED = ("prompt_ids", "prompt_mask")  # TRL left-pads prompts and right-pads completions
PAD_ID = ("prompt_ids", "completion_ids")  # filled with the pad token; every other tensor with 0
PER_ROW = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "old_per_token_logps",
           "sampling_per_token_logps", "ref_per_token_logps", "importance_sampling_ratio", "tool_mask")


class DynamicSamplingGRPOTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` that trains only on groups with reward variance, generating more until a generation
    batch is full (DAPO's dynamic sampling; see the module doc for how and at what cost).

    Args (keyword-only, besides ``GRPOTrainer``'s, which are unchanged):
        dynamic_sampling: a `DynamicSampling` over ``train_dataset`` with ``batch_size`` =
            ``generation_batch_size // num_generations`` and ``group_size`` = ``num_generations`` (default: one
            with ``oversample`` 1 and the trainer's seed). Its ``max_rounds`` is DAPO's ``max_num_gen_batches``:
            a batch still short after that many rounds raises a RuntimeError, as DAPO's reference does.
        feedback_reward: which reward decides "zero variance": None (default) for the weighted sum TRL trains on,
            or a reward function's name or position in ``reward_funcs`` (as in `PrioritizedGRPOTrainer`).

    ``trainer.dynamic_sampling`` is the `DynamicSampling` (``stats()``: groups generated, kept, dropped, trimmed).

    Example (the tiny run of `PrioritizedGRPOTrainer`'s; every group's reward varies, so nothing is dropped, and each
    step trims the third group its over-sampled draw generated):
        >>> import tempfile
        >>> from replayloader.prompts import DynamicSampling, DynamicSamplingGRPOTrainer
        >>> from datasets import Dataset
        >>> from tokenizers import Tokenizer, models, pre_tokenizers
        >>> from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
        >>> from trl import GRPOConfig
        >>> vocab = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate("0123456789+=")}}
        >>> raw = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
        >>> raw.pre_tokenizer = pre_tokenizers.Split("", "isolated")
        >>> tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", eos_token="<eos>")
        >>> model = GPT2LMHeadModel(GPT2Config(vocab_size=len(vocab), n_positions=16, n_embd=16, n_layer=2,
        ...                                    n_head=2, bos_token_id=1, eos_token_id=1, pad_token_id=0))
        >>> def alternating(completions, **kwargs):
        ...     return [float(i % 2) for i in range(len(completions))]
        >>> args = GRPOConfig(tempfile.mkdtemp(), per_device_train_batch_size=8, num_generations=4,
        ...                   max_completion_length=3, max_steps=2, use_cpu=True, report_to="none",
        ...                   save_strategy="no", logging_strategy="no", disable_tqdm=True)
        >>> prompts = Dataset.from_dict({"prompt": [f"{i % 10}+{i // 10}=" for i in range(40)]})
        >>> trainer = DynamicSamplingGRPOTrainer(model=model, reward_funcs=alternating, args=args,
        ...                                      train_dataset=prompts, processing_class=tokenizer,
        ...                                      dynamic_sampling=DynamicSampling(40, 2, oversample=1.5, group_size=4))
        >>> _ = trainer.train()  # doctest: +ELLIPSIS
        {'train_runtime': ...}
        >>> trainer.dynamic_sampling.stats()["kept"], trainer.dynamic_sampling.stats()["trimmed"]
        (4, 2)
    """

    def __init__(self, *args: Any, dynamic_sampling: DynamicSampling | None = None,
                 feedback_reward: str | int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.accelerator.num_processes > 1:
            raise ValueError(f"DynamicSamplingGRPOTrainer runs in one process, got {self.accelerator.num_processes}: "
                             f"each process would keep a different number of groups, and DDP needs equal batches")
        if self.train_dataset is None or len(self.train_dataset) == 0:
            raise ValueError("train_dataset has no rows: there are no prompts to draw")
        num_prompts = len(self.train_dataset)
        chunk = self.args.generation_batch_size // self.num_generations
        if dynamic_sampling is None:
            dynamic_sampling = DynamicSampling(num_prompts, chunk, group_size=self.num_generations,
                                               seed=self.args.seed)
        fitted_sampler(self, "dynamic_sampling", dynamic_sampling, DynamicSampling, "groups")
        if dynamic_sampling.group_size not in (None, self.num_generations):
            raise ValueError(f"dynamic_sampling.group_size is {dynamic_sampling.group_size} but num_generations is "
                             f"{self.num_generations}")
        self.dynamic_sampling = dynamic_sampling
        self.feedback_column = feedback_column(self.reward_func_names, feedback_reward)
        self._round_rewards: torch.Tensor | None = None
        self.add_callback(SaveStateEachCheckpoint(self.dynamic_sampling.state_dict, STATE_FILE))

    # ------------------------------------------------------------------ one generation batch, filled
    def _generate_and_score_completions(self, inputs: list[dict]) -> dict[str, Any]:
        """TRL's generation batch, in training made only of groups with reward variance (see the module doc)."""
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)
        dynamic, group = self.dynamic_sampling, self.num_generations
        parts, rounds, before = [], 0, dict(dynamic.counters)
        while True:
            drawn = dynamic.next_batch()
            rows = self.train_dataset.select(drawn.indices.tolist()).to_list()
            output = super()._generate_and_score_completions([row for row in rows for _ in range(group)])
            values, source = feedback_values(self, self._round_rewards, self.feedback_column)
            try:
                keep = dynamic.feedback(drawn.indices, rewards=values.reshape(len(drawn.indices), group))
            except ValueError as exc:
                raise ValueError(f"dynamic sampling refused the rewards of {source}: {exc}") from exc
            rounds += 1
            if dynamic.max_rounds is None and rounds % WARN_EVERY == 0:
                warnings.warn(f"dynamic sampling: {rounds} rounds for one batch and {dynamic.kept} of "
                              f"{dynamic.batch_size} groups with reward variance so far; with max_rounds=None it "
                              f"generates until the batch fills, which it never does if every group's completions "
                              f"all get the same reward (set max_rounds, DAPO's max_num_gen_batches, to stop)",
                              RuntimeWarning, stacklevel=2)
            if keep.any():
                parts.append(_rows(output, np.repeat(keep, group)))
            if dynamic.full:
                break
        if dynamic.need:
            raise RuntimeError(f"dynamic sampling kept {dynamic.kept} of {dynamic.batch_size} groups in "
                               f"{dynamic.max_rounds} rounds (max_rounds): raise max_rounds or oversample, or the "
                               f"prompts are all solved or all failed")
        self._metrics["train"]["dynamic/rounds"].append(float(rounds))
        generated = dynamic.counters["groups"] - before["groups"]
        self._metrics["train"]["dynamic/frac_dropped"].append((dynamic.counters["dropped"] - before["dropped"])
                                                               / generated)
        return _joined(parts, self.processing_class.pad_token_id)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """TRL's rewards, kept for the round's filter (one process: the table is this batch's)."""
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._round_rewards = rewards
        return rewards

    # ------------------------------------------------------------------ checkpoints
    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs: Any):
        """``GRPOTrainer.train``; resuming also restores the `DynamicSampling` from the checkpoint's
        ``dynamic_sampling.npz``."""
        resume_from_checkpoint, state = checkpoint_state(self.args.output_dir, resume_from_checkpoint, STATE_FILE,
                                                         "DynamicSamplingGRPOTrainer")
        if state is not None:
            self.dynamic_sampling.load_state_dict(state)
            self._warn_off_boundary(Path(resume_from_checkpoint))
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    def _warn_off_boundary(self, checkpoint: Path) -> None:
        """Warn when ``checkpoint`` was saved inside a generation cycle: TRL regenerates the batch it was reusing,
        and the regeneration draws new prompts, so the resumed run leaves the uninterrupted one's stream."""
        cycle = self.args.steps_per_generation * self.num_iterations
        try:
            step = json.loads((checkpoint / "trainer_state.json").read_text())["global_step"]
        except (OSError, ValueError, KeyError):
            return  # transformers itself reports a checkpoint without its state
        if step % cycle:
            warnings.warn(f"{checkpoint} was saved at step {step}, inside a generation cycle of {cycle} steps "
                          f"(steps_per_generation x num_iterations): the resumed run regenerates that batch from new "
                          f"prompts and will not repeat the uninterrupted run (save_steps a multiple of {cycle} "
                          f"resumes exactly)", RuntimeWarning, stacklevel=3)


def _rows(output: dict[str, Any], keep: np.ndarray) -> dict[str, Any]:
    """The rows ``keep`` (bool, one per completion) of TRL's generation-batch dictionary. Only text batches: a key
    this does not know how to slice (images, tools' extra fields) is refused rather than silently misaligned."""
    unknown = sorted(set(output) - set(PER_ROW) - {"num_items_in_batch"})
    if unknown:
        raise ValueError(f"DynamicSamplingGRPOTrainer handles text batches; TRL's batch also holds {unknown}")
    index = torch.as_tensor(np.flatnonzero(keep))
    return {key: value[index.to(value.device)] for key, value in output.items()
            if key != "num_items_in_batch" and value is not None}


def _joined(parts: list[dict[str, Any]], pad_id: int) -> dict[str, Any]:
    """The kept rows of every round as one generation batch: sequences padded to the longest (prompts on the left,
    completions on the right, as TRL pads them), and ``num_items_in_batch`` (the loss's token count, which TRL
    takes over the whole generation batch) recounted over the kept completion tokens."""
    joined: dict[str, Any] = {}
    for key in parts[0]:
        values = [part[key] for part in parts]
        if values[0].ndim == 2:
            width = max(v.shape[1] for v in values)
            fill = pad_id if key in PAD_ID else 0
            values = [torch.nn.functional.pad(v, (width - v.shape[1], 0) if key in LEFT_PADDED
                                              else (0, width - v.shape[1]), value=fill) for v in values]
        joined[key] = torch.cat(values)
    mask = joined["completion_mask"] * joined["tool_mask"] if "tool_mask" in joined else joined["completion_mask"]
    joined["num_items_in_batch"] = mask.sum()
    return joined
