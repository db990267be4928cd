"""VerlPromptSampler: a `PromptSampler` behind verl's curriculum-sampler contract (``data.sampler.class_path``).

Optional module (needs torch; verl itself is optional). The contract, as verl 0.4–0.7 define it (PR #2314,
``verl/experimental/dataset/sampler.py``, the trainer in ``verl/trainer/ppo/ray_trainer.py``):

- the class is named by ``data.sampler.class_path`` (``pkg://module`` or a file) and ``data.sampler.class_name``,
  built as ``cls(data_source=train_dataset, data_config=config.data)`` and must be an ``AbstractSampler`` (a torch
  ``Sampler[int]``): when verl imports, this class subclasses its ``AbstractCurriculumSampler``, else torch's
  ``Sampler`` (for use and tests without verl);
- verl's ``StatefulDataLoader`` batches its indices (``data.gen_batch_size``, else ``data.train_batch_size``
  prompts, ``drop_last``), and verl asks for ``data.dataloader_num_workers=0`` so that nothing is read ahead;
- after each training step the trainer calls ``update(batch=batch)`` with the step's ``DataProto``: one row per
  response, ``batch.non_tensor_batch["uid"]`` the same for the ``rollout.n`` responses of one prompt,
  ``batch.batch["token_level_scores"]`` the reward function's score (summed over tokens: each response's reward);
- checkpoints: verl saves ``train_dataloader.state_dict()``, and torchdata's loader saves and restores a sampler
  that has ``state_dict`` / ``load_state_dict`` (this one) instead of fast-forwarding it.

verl 0.8 removed this interface (its replay buffer ``trainer.v1.sampler`` replaces it), and verl does not install
beside this project's test environment (0.7 pins numpy < 2; 0.9 pins transformers < 5.11), so this class is tested
against the contract above (tests/prompts/test_verl.py builds it as verl does, drives it with a torchdata
``StatefulDataLoader`` and ``DataProto``-shaped batches), not against verl's own class.

**Which prompt a response answers**: ``batch.non_tensor_batch["index"]``, which verl's ``RLHFDataset`` copies from
each row's ``extra_info["index"]`` (verl's data scripts write the row number there). It must be the row's position
in the training dataset (so no rows dropped by ``filter_overlong_prompts`` before it); another key can be named with
``data.sampler.index_key``. A value this sampler did not hand out since the last update raises, naming the key.

**Options** under ``data.sampler`` (Hydra: ``+data.sampler.<name>=<value>``): ``rule`` (``learnability``,
``reward_spread`` or ``uniform``), ``index_key``, ``reward_key`` (default ``token_level_scores``), ``group_key``
(default ``uid``), ``max_lag`` (default 1), ``seed`` (default ``data.seed``, else 0), and `PromptSampler`'s
``prior``, ``prior_strength``, ``prior_memory``, ``exploration``, ``retest_every``, ``retest_size``,
``stale_after``, ``retire_after``, ``solved_reward``. An unknown key raises, naming it.

**Checkpoints.** verl writes its checkpoint before it calls ``update`` for that step, so a resumed run never feeds
back the last batch before the checkpoint: `load_state_dict` forgets what was awaiting feedback (the position, the
records and the generator resume exactly).
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from .. import _checks as checks
from .._arrays import to_numpy
from ..state.checks import check_header, counters, field, integer
from .rules import Learnability, RewardSpread, Uniform
from .sampler import PromptBatch, PromptSampler

try:  # verl's own base class, so that its trainer's isinstance checks pass
    from verl.experimental.dataset.sampler import AbstractCurriculumSampler as _Base
except ImportError:  # verl absent (or without this interface: verl >= 0.8)
    _Base = Sampler

STATE_VERSION = 1
RULES = {"learnability": Learnability, "reward_spread": RewardSpread, "uniform": Uniform}
_OWN = ("class_path", "class_name", "rule", "index_key", "reward_key", "group_key", "max_lag", "seed")
_PASSED = ("prior", "prior_strength", "prior_memory", "exploration", "retest_every", "retest_size", "stale_after",
           "retire_after", "solved_reward")


_ABSENT = object()


def _get(config: Any, key: str, default: Any = None, *, null: Any = _ABSENT) -> Any:
    """``config[key]`` for a dict or an omegaconf DictConfig, else ``default``; a key set to null (None) gives
    ``default`` too, unless ``null`` says what it means (``max_lag: null``: no bound, as ``max_lag=None``)."""
    if config is None:
        return default
    value = config.get(key, _ABSENT) if hasattr(config, "get") else getattr(config, key, _ABSENT)
    if value is _ABSENT:
        return default
    if value is None:
        return default if null is _ABSENT else null
    return value


class VerlPromptSampler(_Base):
    """Prompt indices for verl's trainer, drawn by a `PromptSampler` and fed by ``update(batch)`` (module doc).

    Args:
        data_source: the training dataset (its length is the number of prompts).
        data_config: verl's ``config.data`` (a DictConfig or a dict): ``gen_batch_size`` or ``train_batch_size``,
            ``seed``, and the options under ``sampler``.

    Config lines (verl 0.4–0.7)::

        data.sampler.class_path=pkg://replayloader.prompts.verl
        data.sampler.class_name=VerlPromptSampler
        data.dataloader_num_workers=0
        +data.sampler.retest_every=10

    Example (one step, with a batch shaped as verl's ``DataProto``):
        >>> import itertools, numpy as np, torch
        >>> from types import SimpleNamespace
        >>> sampler = VerlPromptSampler(range(100), {"train_batch_size": 4, "sampler": {"exploration": 0.1}})
        >>> prompts = list(itertools.islice(iter(sampler), 4))  # one step's prompts
        >>> responses = np.repeat(prompts, 2)  # rollout.n = 2
        >>> scores = torch.zeros(8, 5)
        >>> scores[::2, -1] = 1.0  # the first response of each prompt is right
        >>> sampler.update(SimpleNamespace(batch={"token_level_scores": scores}, non_tensor_batch={
        ...     "index": responses.astype(object), "uid": np.repeat(["a", "b", "c", "d"], 2).astype(object)}))
        >>> sampler.prompts.stats()["groups"]
        4
    """

    def __init__(self, data_source: Any, data_config: Any) -> None:
        options = _get(data_config, "sampler", {})
        unknown = sorted(set(options.keys()) - set(_OWN) - set(_PASSED)) if hasattr(options, "keys") else []
        if unknown:
            raise ValueError(f"data.sampler has unknown keys {unknown}; VerlPromptSampler reads {list(_OWN[2:])} "
                             f"and PromptSampler's {list(_PASSED)}")
        num_prompts = len(data_source)
        batch_size = _get(data_config, "gen_batch_size") or _get(data_config, "train_batch_size")
        if batch_size is None:
            raise ValueError("data_config needs train_batch_size (or gen_batch_size): the prompts of one step")
        rule = checks.one_of("data.sampler.rule", _get(options, "rule", "learnability"), tuple(RULES))
        passed = {name: _get(options, name) for name in _PASSED if _get(options, name) is not None}
        self.prompts = PromptSampler(num_prompts, batch_size, rule=RULES[rule](), seed=_get(
            options, "seed", _get(data_config, "seed", 0)), **passed)
        self.index_key = str(_get(options, "index_key", "index"))
        self.reward_key = str(_get(options, "reward_key", "token_level_scores"))
        self.group_key = str(_get(options, "group_key", "uid"))
        self.max_lag = checks.optional_integer("data.sampler.max_lag", _get(options, "max_lag", 1, null=None), 0)
        self.num_batches = len(self.prompts)  # N // B: verl's loader drops an incomplete last batch
        self.batch: PromptBatch | None = None
        self.offset = 0  # indices of the current batch handed out
        self.chunk = 0  # batches started in this epoch
        self.epoch = 0
        self.pending: set[int] = set()  # prompts handed out since the last update
        self.counters = {"batches_drawn": 0, "updates": 0, "lag": 0, "max_lag_seen": 0}
        self._awaiting = 0  # batches drawn since the last update

    def __len__(self) -> int:
        return self.num_batches * self.prompts.batch_size

    def __iter__(self) -> Iterator[int]:
        """The rest of the current epoch (all of it when it has not started); then the next epoch begins. A batch
        is drawn when its first index is asked for, so it sees every update given by then."""
        if self.batch is not None and self.offset == len(self.batch):  # handed out whole (as `state_dict` says)
            self.batch, self.offset = None, 0
        if self.batch is None and self.chunk == self.num_batches:
            self.chunk, self.epoch = 0, self.epoch + 1
        while self.batch is not None or self.chunk < self.num_batches:
            if self.batch is None:
                self._draw()
            while self.offset < len(self.batch):
                index = int(self.batch.indices[self.offset])
                self.offset += 1
                self.pending.add(index)
                yield index
            self.batch, self.offset = None, 0

    def _draw(self) -> None:
        if self.max_lag is not None and self._awaiting > self.max_lag:
            raise RuntimeError(f"{self._awaiting} batches drawn before this one still await update(batch) "
                               f"(data.sampler.max_lag={self.max_lag}): set data.dataloader_num_workers=0, as verl "
                               f"asks of a curriculum sampler, or raise max_lag")
        self.batch = self.prompts.next_batch()
        self.chunk += 1
        self.counters["batches_drawn"] += 1
        self.counters["lag"] = self._awaiting
        self.counters["max_lag_seen"] = max(self.counters["max_lag_seen"], self._awaiting)
        self._awaiting += 1

    # ------------------------------------------------------------------ feedback
    def update(self, batch: Any) -> None:
        """Feed one training step's rewards back: each prompt's group of responses (rows sharing ``uid``), its
        reward (``token_level_scores`` summed over tokens) and its prompt (``index``). Bad input raises a
        ValueError naming the key, and nothing changes."""
        indices, rewards = self._groups(batch)
        try:
            self.prompts.feedback(indices, rewards=rewards)
        except ValueError as exc:
            raise ValueError(f"VerlPromptSampler.update: the rewards in batch.batch[{self.reward_key!r}] were refused:"
                             f" {exc}" + (" (or set data.sampler.rule=reward_spread)" if "0 or 1" in str(exc) else "")
                             ) from exc
        self.pending.clear()
        self._awaiting = 0
        self.counters["updates"] += 1

    def _groups(self, batch: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(prompt indices (k,), rewards (k, n))`` from a DataProto: rows grouped by ``group_key``."""
        tensors, others = getattr(batch, "batch", None), getattr(batch, "non_tensor_batch", None)
        if tensors is None or others is None:
            raise TypeError(f"batch must be a verl DataProto (.batch and .non_tensor_batch), got {type(batch).__name__}")
        for where, source, key in (("batch.batch", tensors, self.reward_key),
                                   ("batch.non_tensor_batch", others, self.index_key),
                                   ("batch.non_tensor_batch", others, self.group_key)):
            if key not in source.keys():
                raise ValueError(f"{where} has no {key!r} (it has {sorted(source.keys())})")
        scores = to_numpy(tensors[self.reward_key], f"batch.batch[{self.reward_key!r}]").astype(np.float64)
        if scores.ndim == 2:
            scores = scores.sum(axis=1)  # a response's reward sits on its last token
        groups = np.asarray(others[self.group_key])
        try:
            index = np.asarray(others[self.index_key]).astype(np.int64)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"batch.non_tensor_batch[{self.index_key!r}] must hold each response's prompt index, "
                             f"an integer: {exc}") from exc
        rows = len(scores)
        if scores.ndim != 1 or index.shape != (rows,) or groups.shape != (rows,):
            raise ValueError(f"batch.batch[{self.reward_key!r}], batch.non_tensor_batch[{self.index_key!r}] and "
                             f"[{self.group_key!r}] must have one entry per response; got shapes "
                             f"{tuple(scores.shape)}, {index.shape}, {groups.shape}")
        _, first, which = np.unique(groups, return_index=True, return_inverse=True)
        sizes = np.bincount(which)
        if len(sizes) == 0 or (sizes != sizes[0]).any() or sizes[0] < 2:
            raise ValueError(f"every group of batch.non_tensor_batch[{self.group_key!r}] must hold the same number "
                             f"(rollout.n >= 2) of responses; got group sizes {sorted(set(sizes.tolist()))}")
        order = np.argsort(first)  # groups in the order they first appear
        members = np.argsort(which, kind="stable").reshape(len(sizes), sizes[0])[order]
        prompt = index[members]
        odd = np.flatnonzero((prompt != prompt[:, :1]).any(axis=1))
        if len(odd):
            raise ValueError(f"batch.non_tensor_batch[{self.index_key!r}] differs inside one group of "
                             f"{self.group_key!r}: {sorted(set(prompt[odd[0]].tolist()))}")
        stranger = [int(i) for i in prompt[:, 0] if int(i) not in self.pending]
        if stranger:
            raise ValueError(f"batch.non_tensor_batch[{self.index_key!r}] holds {stranger[0]}, which this sampler "
                             f"did not hand out since the last update: that key must hold each prompt's row in the "
                             f"training dataset (verl's RLHFDataset copies extra_info['index']: write the row number "
                             f"there, and drop no rows before it), or name another key with data.sampler.index_key")
        return prompt[:, 0], scores[members]

    def stats(self) -> dict[str, Any]:
        """The prompt sampler's statistics plus the epoch and this sampler's counters (for verl's metrics)."""
        return {**self.prompts.stats(), "epoch": self.epoch, "chunk": self.chunk, **self.counters}

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        """The prompt sampler's state and the position in the epoch and the current batch."""
        done = self.batch is None or self.offset == len(self.batch)
        return {"version": STATE_VERSION, "config": {"num_batches": self.num_batches}, "prompts":
                self.prompts.state_dict(), "epoch": self.epoch, "chunk": self.chunk, "offset": 0 if done else self.offset,
                **PromptBatch.fields(None if done else self.batch), "counters": dict(self.counters)}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore a `state_dict` (checked first: `InvalidState` names the bad field, nothing changes). What was
        handed out before it awaits no feedback any more (verl saves before the step's update)."""
        where = check_header(state, STATE_VERSION, {"num_batches": self.num_batches}, "verl prompt sampler")
        b = self.prompts.batch_size
        epoch = integer(state, "epoch", where, 0)
        chunk = integer(state, "chunk", where, 0, self.num_batches)
        offset = integer(state, "offset", where, 0, b - 1)
        batch = PromptBatch.read_fields(state, where, size=b, offset=offset, started=chunk,
                                        num_prompts=self.prompts.num_prompts, unit="batch")
        counts = counters(state, "counters", where, self.counters)
        self.prompts.load_state_dict(field(state, "prompts", where))  # checks all of its state before it changes
        self.epoch, self.chunk, self.offset, self.counters = epoch, chunk, offset, counts
        self.batch = batch
        self.pending = set() if batch is None else set(batch.indices[:offset].tolist())
        self._awaiting = int(batch is not None)
