"""PrioritizedGRPOTrainer: TRL's ``GRPOTrainer`` drawing its prompts by learnability, fed by the rewards it computes.

Optional module (needs trl: ``pip install replayloader[trl]``). Public hooks of the trainer only, no patching:

- **The prompts.** ``train_dataset`` gets a column ``prompt_index`` (each row's position), and
  `_get_train_sampler` returns a `GRPOPromptSampler` in TRL's ``RepeatSampler`` layout (chunks of
  ``generation_batch_size // num_generations`` prompts, each ``num_generations`` times in a row, each chunk
  ``num_iterations × steps_per_generation`` times), so generation, ``steps_per_generation`` and ``num_iterations``
  work as with TRL's own sampler.
- **The feedback.** `_calculate_rewards` runs the reward functions the user passed, unchanged (they see the extra
  ``prompt_index`` keyword, which a reward function with ``**kwargs`` ignores), and returns TRL's table of
  rewards, gathered from all processes. Why this hook: it is called once per generation batch (not once per
  optimizer step, so ``num_iterations`` reuse and ``steps_per_generation`` slices feed nothing twice), it holds
  the batch's inputs in generation order (the ``prompt_index`` column says which prompt each completion answers;
  the advantages computed after it are shuffled and carry no index), and every process holds the whole table.
  Each process passes its own slice, as `GRPOPromptSampler.feedback` takes it (a collective: the slices are
  gathered and every process applies the same update). The reward fed back is the weighted sum TRL trains on
  (``reward_weights``), or one function's with ``feedback_reward=`` (e.g. the correctness reward when a format
  reward is added to it). Evaluation feeds nothing back.
- **Logs.** Besides TRL's ``frac_reward_zero_std`` (its share of zero-variance groups), each generation logs
  ``prompts/frac_zero_variance`` (the sampler's, over the rewards it was fed) and ``prompts/lag``; each log line adds
  the sampler's counts (``prompts/measured``, ``prompts/judged``, ``prompts/retests``, ``prompts/retired``, ...).
- **Checkpoints.** A callback writes the sampler's state into every checkpoint folder (``prompt_sampler.npz``, one
  file for all processes) and `train(resume_from_checkpoint=...)` restores it, so the resumed run draws the prompt
  stream the uninterrupted one would have (``args.ignore_data_skip`` is set: the sampler resumes its own position,
  and skipping batches would draw them again). The checkpoint's RNG states are restored after the DataLoader's
  first batch (`_load_rng_state`), so the resumed run also samples the same completions, and a reward that
  depends on them steers the same prompt stream. The DataLoader reads one generation batch ahead of training, which
  a stopped process loses: the saved state hands those indices out again (`GRPOPromptSampler.state_dict`'s
  ``unconsumed``). With ``num_iterations > 1``, save at generation boundaries (``save_steps`` a multiple of
  ``num_iterations``): TRL itself regenerates a batch it was reusing when it resumes mid-cycle.

Bad input at this level: a reward function that returns None, NaN or inf for a completion (the sampler needs every
completion's reward), rewards outside {0, 1} for `Learnability`, a sampler that does not fit the trainer's
batch, a dataset without rows or with a ``prompt_index`` column of its own: each raises a ValueError naming the
argument, before the sampler changes.
"""
from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch
from trl import GRPOTrainer

from .. import _checks as checks
from ..torch.hf import SaveStateEachCheckpoint, checkpoint_state
from .sampler import PromptSampler
from .torch import GRPOPromptSampler

INDEX = "prompt_index"  # the column every training row gets: its position in train_dataset
STATE_FILE = "prompt_sampler.npz"  # the sampler's file in a checkpoint folder
_LOGGED = ("measured", "judged", "active", "retired", "retests", "exploration_draws", "groups", "max_lag_seen")


def _with_index(dataset: Any) -> Any:
    """``dataset`` (a `datasets.Dataset`) with the column ``prompt_index`` = each row's position."""
    from datasets import Dataset

    if not isinstance(dataset, Dataset):
        raise TypeError(f"train_dataset must be a datasets.Dataset (a prompt sampler draws rows by index; an "
                        f"IterableDataset has none), got {type(dataset).__name__}")
    if len(dataset) == 0:
        raise ValueError("train_dataset has no rows: there are no prompts to draw")
    if INDEX in dataset.column_names:
        raise ValueError(f"train_dataset already has a column {INDEX!r}, which PrioritizedGRPOTrainer adds (each "
                         f"row's position, the prompt index fed back to the sampler); rename it")
    return dataset.add_column(INDEX, np.arange(len(dataset), dtype=np.int64))


def feedback_column(names: Any, feedback_reward: str | int | None) -> int | None:
    """The column of TRL's reward table that feeds a sampler: None for the weighted sum TRL trains on, else the
    position of the reward function named (as TRL logs it, ``rewards/<name>``) or given by position."""
    names = tuple(names)
    if feedback_reward is None:
        return None
    if isinstance(feedback_reward, str):
        return names.index(checks.one_of("feedback_reward", feedback_reward, names))
    return checks.integer("feedback_reward", feedback_reward, 0, len(names) - 1,
                          why=f"a position in reward_funcs, whose names are {list(names)}")


def feedback_values(trainer: GRPOTrainer, rewards: torch.Tensor, column: int | None) -> tuple[np.ndarray, str]:
    """One reward per completion of the generation batch (every process's, in generation order) from TRL's reward
    table: the weighted sum TRL trains on (``column`` None; a function weighted 0 neither trains nor feeds the
    sampler) or one function's column; and a phrase naming where it came from. A completion whose reward is
    None (read as nan) or infinite raises a ValueError naming the function: every process holds the whole table,
    so all raise together and no sampler changes."""
    table = rewards.detach().to(torch.float64).cpu().numpy()  # (completions of all processes, functions)
    names = list(trainer.reward_func_names)
    if column is None:
        weights = trainer.reward_weights.detach().cpu().numpy().astype(np.float64)
        used = np.flatnonzero(weights != 0)
        values = table[:, used] @ weights[used]
        source = f"the weighted sum of reward_funcs {names}"
    else:
        used = np.array([column])
        values = table[:, column]
        source = f"reward_funcs[{column}] ({names[column]!r})"
    for j in used:
        bad = np.flatnonzero(~np.isfinite(table[:, j]))
        if len(bad):
            raise ValueError(
                f"reward_funcs[{j}] ({names[j]!r}) returned {table[bad[0], j]}"
                + (" (None is read as nan)" if np.isnan(table[bad[0], j]) else "")
                + f" for completion {bad[0]} of this generation batch: the prompt sampler needs every completion's "
                f"reward, so return a finite number (0.0 for a failure)"
                + ("" if column is not None or len(names) == 1 else
                   ", or feed it from one reward function with feedback_reward=<name>"))
    return values, source


def fitted_sampler(trainer: GRPOTrainer, name: str, sampler: Any, kind: type, unit: str, hint: str = "") -> Any:
    """``sampler`` (the trainer's argument ``name``) if it is a ``kind`` over the trainer's ``train_dataset`` with
    one generation batch's ``generation_batch_size // num_generations`` prompts a draw; else the error naming the
    argument, the value and (``hint``) what to build. ``unit``: what the batch's rows are called in the message."""
    if not isinstance(sampler, kind):
        raise TypeError(f"{name} must be a {kind.__name__}, got {type(sampler).__name__}")
    num_prompts = len(trainer.train_dataset)
    chunk = trainer.args.generation_batch_size // trainer.num_generations
    if sampler.num_prompts != num_prompts:
        raise ValueError(f"{name}.num_prompts is {sampler.num_prompts} but train_dataset has {num_prompts} rows")
    if sampler.batch_size != chunk:
        raise ValueError(f"{name}.batch_size is {sampler.batch_size} but a generation batch holds {chunk} {unit} "
                         f"(generation_batch_size {trainer.args.generation_batch_size} // num_generations "
                         f"{trainer.num_generations}){hint}")
    return sampler


class PrioritizedGRPOTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` whose prompts come from a `PromptSampler`, fed by each generation batch's rewards.

    Why: a prompt whose ``num_generations`` completions all get the same reward gives zero advantage, yet its
    rollouts cost the most; the rewards already say which prompts are partly solved (see the module doc).

    Args (keyword-only, besides ``GRPOTrainer``'s, which are unchanged):
        prompt_sampler: a `PromptSampler` over ``train_dataset`` with ``batch_size`` =
            ``generation_batch_size // num_generations`` and ``group_size`` = ``num_generations`` (default: the
            `Learnability` sampler with the trainer's seed). Under several processes build the same on each.
        feedback_reward: which reward feeds the sampler: None (default) for the weighted sum TRL trains on, or a
            reward function's name (as TRL logs it under ``rewards/<name>``) or position in ``reward_funcs``.
        max_lag: `GRPOPromptSampler`'s bound on generation batches drawn ahead of their feedback (TRL's defaults
            draw one ahead).

    ``trainer.prompt_sampler`` is the `GRPOPromptSampler` (``.prompts`` the `PromptSampler`, for
    ``pass_rates()`` and ``stats()``).

    Example (a 2-layer GPT-2 learning to answer ``"1"``; `examples/grpo_prompts.py` is a full run):
        >>> import tempfile
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
        >>> def starts_with_one(completions, **kwargs):
        ...     return [float(c.startswith("1")) for c in completions]
        >>> args = GRPOConfig(tempfile.mkdtemp(), per_device_train_batch_size=8, num_generations=4,
        ...                   max_completion_length=3, max_steps=2, use_cpu=True, report_to="none",
        ...                   save_strategy="no", logging_strategy="no", disable_tqdm=True)
        >>> prompts = Dataset.from_dict({"prompt": [f"{i % 10}+{i // 10}=" for i in range(40)]})
        >>> trainer = PrioritizedGRPOTrainer(model=model, reward_funcs=starts_with_one, args=args,
        ...                                  train_dataset=prompts, processing_class=tokenizer,
        ...                                  prompt_sampler=PromptSampler(40, 2, group_size=4, seed=0))
        >>> _ = trainer.train()  # doctest: +ELLIPSIS
        {'train_runtime': ...}
        >>> trainer.prompt_sampler.stats()["feedback_calls"]
        2
    """

    def __init__(self, *args: Any, prompt_sampler: PromptSampler | None = None, feedback_reward: str | int | None = None,
                 max_lag: int | None = 1, **kwargs: Any) -> None:
        bound = inspect.signature(GRPOTrainer.__init__).bind(self, *args, **kwargs)
        bound.arguments["train_dataset"] = _with_index(bound.arguments.get("train_dataset"))
        super().__init__(*bound.args[1:], **bound.kwargs)
        num_prompts = len(self.train_dataset)
        chunk = self.args.generation_batch_size // self.num_generations
        if prompt_sampler is None:
            prompt_sampler = PromptSampler(num_prompts, chunk, group_size=self.num_generations, seed=self.args.seed)
        fitted_sampler(self, "prompt_sampler", prompt_sampler, PromptSampler, "prompts",
                       f": build PromptSampler({num_prompts}, {chunk}, group_size={self.num_generations}, ...)")
        # Under DDP this checks that every rank built the same sampler (a collective).
        self.prompt_sampler = GRPOPromptSampler(prompt_sampler, num_generations=self.num_generations,
                                                repeat_count=self.num_iterations * self.args.steps_per_generation,
                                                max_lag=max_lag)
        self.feedback_column = feedback_column(self.reward_func_names, feedback_reward)
        self.args.ignore_data_skip = True  # the sampler resumes its own stream: skipping would draw batches again
        self._consumed = 0  # sampler indices in the batches training steps received (the rest was read ahead)
        self._rng_checkpoint, self._fetched = None, True  # see _load_rng_state
        self.add_callback(SaveStateEachCheckpoint(self.sampler_state, STATE_FILE))

    # ------------------------------------------------------------------ the prompts
    def _get_train_sampler(self, dataset: Any = None) -> GRPOPromptSampler:
        """The `GRPOPromptSampler` (TRL's ``RepeatSampler`` layout, drawn by priority)."""
        return self.prompt_sampler

    def _set_signature_columns_if_needed(self) -> None:
        super()._set_signature_columns_if_needed()
        if INDEX not in self._signature_columns:  # remove_unused_columns=True must keep the index
            self._signature_columns = [*self._signature_columns, INDEX]

    def training_step(self, model, inputs, *args: Any, **kwargs: Any) -> torch.Tensor:
        """`GRPOTrainer.training_step`, counting what it received: one generation batch of sampler indices."""
        self._consumed += self.args.generation_batch_size
        return super().training_step(model, inputs, *args, **kwargs)

    # ------------------------------------------------------------------ the feedback
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """TRL's rewards (every process's, gathered), and, in training, each prompt's group fed to the sampler."""
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self.model.training:
            self._feed_back(inputs, rewards)
        return rewards

    def _feed_back(self, inputs: list[dict], rewards: torch.Tensor) -> None:
        values, source = feedback_values(self, rewards, self.feedback_column)
        local = len(inputs)
        mine = values[self.accelerator.process_index * local:(self.accelerator.process_index + 1) * local]
        indices = np.array([row[INDEX] for row in inputs], np.int64)
        try:
            self.prompt_sampler.feedback(indices, rewards=mine, policy_step=self.state.global_step)
        except ValueError as exc:
            raise ValueError(f"the prompt sampler refused the rewards of {source}: {exc}") from exc
        # per generation, averaged over a log line's steps as TRL averages its own metrics
        self._metrics["train"]["prompts/frac_zero_variance"].append(self.prompt_sampler.prompts.last_zero_variance)
        self._metrics["train"]["prompts/lag"].append(float(self.prompt_sampler.counters["lag"]))

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        """TRL's log line, with the sampler's counts on training lines (O(N): once per log, not per step)."""
        if self.model.training and "loss" in logs:
            stats = self.prompt_sampler.stats()
            logs = {**logs, **{f"prompts/{name}": float(stats[name]) for name in _LOGGED},
                    "prompts/frac_zero_variance_total": float(stats["frac_zero_variance_total"])}
        super().log(logs, *args, **kwargs)

    # ------------------------------------------------------------------ checkpoints
    def sampler_state(self) -> dict:
        """The sampler's state as the training steps so far left it: the indices the DataLoader read ahead of them
        (lost with the process) count as not handed out, so a resumed sampler hands them out again."""
        ahead = self.prompt_sampler.yielded - self._consumed
        try:
            return self.prompt_sampler.state_dict(unconsumed=ahead)
        except ValueError as exc:
            raise RuntimeError(f"the DataLoader read {ahead} prompt indices ahead of training, beyond the generation "
                               f"batch being handed out, so a checkpoint cannot hand them out again (DataLoader "
                               f"workers read ahead: set dataloader_num_workers=0)") from exc

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs: Any):
        """``GRPOTrainer.train``; resuming also restores the prompt sampler from the checkpoint's
        ``prompt_sampler.npz``."""
        resume_from_checkpoint, state = checkpoint_state(self.args.output_dir, resume_from_checkpoint, STATE_FILE,
                                                         "PrioritizedGRPOTrainer")
        if state is not None:
            self.prompt_sampler.load_state_dict(state)
        self._consumed = self.prompt_sampler.yielded  # a new DataLoader starts where the sampler stands
        self._rng_checkpoint, self._fetched = None, False
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        """Restore the checkpoint's RNG states after the DataLoader's first batch, not before it.

        Why: with ``ignore_data_skip`` (set here) transformers restores them before the epoch's first batch, and
        fetching that batch draws the DataLoader's base seed from torch's generator, so every completion sampled
        after a resume came from a shifted stream (and with rewards that depend on the completions, the prompt
        stream followed). Without ``ignore_data_skip`` transformers itself restores them after the first batch,
        which is what this does; the uninterrupted run drew that seed when its DataLoader started."""
        if getattr(self, "_fetched", True):
            super()._load_rng_state(checkpoint)
        else:
            self._rng_checkpoint = checkpoint

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> tuple[list, Any]:
        """``Trainer.get_batch_samples``, then the RNG restore deferred by `_load_rng_state`."""
        batches = super().get_batch_samples(epoch_iterator, num_batches, device)
        self._fetched = True
        if self._rng_checkpoint is not None:
            checkpoint, self._rng_checkpoint = self._rng_checkpoint, None
            super()._load_rng_state(checkpoint)
        return batches
