"""A fixed test of the discriminator that every run shares: held-out text, corrupted once, scored along training.

Each run's own numbers (the sampled batch's AUC, L_D) are measured on different inputs in different runs: each
discriminator faces its own generator's replacements, and TMR's replayed rows were trained on before. To
compare arms on the *same* inputs, `build_heldout_set` corrupts text no run trains on (for example the lines
after ``--max-lines``) once, with one reference generator and a fixed seed, and saves the result; a run given
``--heldout FILE`` then scores its discriminator on exactly those tokens every ``--heldout-every`` steps.

The file is a safetensors archive (no pickle) whose metadata records how it was made and a digest of the
tokenizer, so a run with another vocabulary is refused instead of scoring meaningless ids. It is written
atomically (the library's `atomic_write`) with a sha256 of its tensors, checked on load: a truncated or damaged
file is a `UserError` naming it, never a held-out score on corrupted tokens (issue 43; files written before the
digest still load).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_tensors, save as save_tensors

from replayloader.state import atomic_write_bytes

from ..errors import UserError
from ..flags import option
from .corruption import SpecialIds, corrupt_batch
from .losses import discriminator_losses
from .metrics import base_rate_entropy, ranking_auc

HELDOUT_FORMAT = 1
FIELDS = ("input_ids", "original_ids", "attention_mask", "masked")
HELDOUT_METRICS = ("heldout_auc", "heldout_loss", "heldout_base_entropy")  # what `evaluate_heldout` returns


def tokenizer_digest(tokenizer: Any) -> str:
    """A short hash of the vocabulary: two tokenizers with the same digest map text to the same ids."""
    vocab = json.dumps(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha1(vocab.encode()).hexdigest()[:16]


@dataclass
class HeldoutSet:
    """Corrupted examples (the buffer's format: input_ids, original_ids, attention_mask, masked) + provenance."""

    tensors: dict[str, torch.Tensor]
    info: dict

    def __len__(self) -> int:
        return len(self.tensors["input_ids"])

    @property
    def replaced_share(self) -> float:
        real = self.tensors["attention_mask"].bool()
        replaced = self.tensors["input_ids"] != self.tensors["original_ids"]
        return float((replaced & real).sum()) / float(real.sum())

    def save(self, path: str | Path) -> None:
        """Write the file atomically (a kill leaves the old file or the new one) with a digest of its tensors."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.contiguous() for k, v in self.tensors.items()}
        metadata = {"format": str(HELDOUT_FORMAT), "info": json.dumps(self.info), "sha256": _tensors_digest(tensors)}
        atomic_write_bytes(path, save_tensors(tensors, metadata=metadata))

    @classmethod
    def load(cls, path: str | Path, tokenizer: Any | None = None, device: torch.device | str = "cpu") -> HeldoutSet:
        """Read a held-out file; with ``tokenizer``, refuse it unless it was made with that vocabulary. A file
        that cannot be read whole, or whose tensors differ from their recorded digest, is a `UserError`."""
        if not Path(path).is_file():
            raise UserError(f"--heldout: no such file: {path}")
        try:  # safetensors' own checks (header, offsets, sizes) catch a truncation; the digest catches flips
            with open(path, "rb") as f:
                data = f.read()
            tensors = load_tensors(data)
            metadata = _metadata(data)
            info = json.loads(metadata["info"]) if metadata.get("format") == str(HELDOUT_FORMAT) else None
        except Exception as err:  # noqa: BLE001 - safetensors, JSON, UTF-8 and OS errors: one meaning
            raise UserError(f"--heldout: {path} is not a readable held-out set (truncated or damaged?): "
                            f"{type(err).__name__}: {err}".replace("\n", " ")) from None
        if not isinstance(info, dict):
            raise UserError(f"--heldout: {path} is not a held-out set of format {HELDOUT_FORMAT} "
                            f"(metadata {metadata.get('format')!r})")
        if "sha256" in metadata and metadata["sha256"] != _tensors_digest(tensors):
            raise UserError(f"--heldout: {path} is damaged: its tensors do not match their recorded sha256; build "
                            f"it again with `heldout`")
        if tokenizer is not None and info.get("tokenizer_digest") != tokenizer_digest(tokenizer):
            raise UserError(f"--heldout: {path} was made with another tokenizer (digest {info.get('tokenizer_digest')}, "
                            f"this run's is {tokenizer_digest(tokenizer)}); build it with this run's corpus, "
                            "vocabulary and cache")
        missing = [name for name in FIELDS if name not in tensors]
        if missing:
            raise UserError(f"--heldout: {path} lacks {', '.join(missing)}")
        return cls({name: tensors[name].to(device) for name in FIELDS}, info)


def _tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes (a flipped byte, a cut or a changed shape differ)."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _metadata(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file's header (its first 8 bytes give the header's length)."""
    size = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + size].decode("utf-8")).get("__metadata__") or {}


@torch.no_grad()
def build_heldout_set(generator: torch.nn.Module, tokenizer: Any, lines: list[str], max_len: int,
                      examples: int, mask_prob: float = 0.15, mask_token_prob: float = 0.85, seed: int = 0,
                      batch_size: int = 64, info: dict | None = None) -> HeldoutSet:
    """Pack ``lines`` into full ``max_len`` examples (the first ``examples`` of them) and corrupt them with the
    generator (an `ElectraForMaskedLM`), exactly as pretraining does, under a private RNG seeded with ``seed``."""
    from ..data import pack_token_stream
    from ..models import masked_lm_logits

    special = SpecialIds.from_tokenizer(tokenizer)
    ids, _ = pack_token_stream(tokenizer(lines, add_special_tokens=False)["input_ids"], max_len, special.cls,
                               special.sep, special.pad, min_tail=max_len)
    if not ids:
        raise UserError(f"the held-out text ({len(lines)} lines) is too short for one example of {max_len} tokens")
    rows = torch.tensor(ids[:examples])
    was_training = generator.training
    generator.eval()
    parts: dict[str, list[torch.Tensor]] = {name: [] for name in FIELDS}
    try:
        with torch.random.fork_rng(devices=[]):  # the caller's RNG stream is left as it was
            torch.manual_seed(seed)
            for start in range(0, len(rows), batch_size):
                chunk = rows[start:start + batch_size]
                raw = {"input_ids": chunk, "attention_mask": (chunk != special.pad).long()}
                data, _ = corrupt_batch(partial(masked_lm_logits, generator), raw, special, mask_prob,
                                        mask_token_prob)
                for name in FIELDS:
                    parts[name].append(data[name])
    finally:
        generator.train(was_training)
    made = {"tokenizer_digest": tokenizer_digest(tokenizer), "examples": len(rows), "max_len": max_len,
            "mask_prob": mask_prob, "mask_token_prob": mask_token_prob, "seed": seed, **(info or {})}
    return HeldoutSet({name: torch.cat(chunks) for name, chunks in parts.items()}, made)


@torch.no_grad()
def evaluate_heldout(discriminator: torch.nn.Module, heldout: HeldoutSet, batch_size: int = 64,
                     autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
                     ) -> dict[str, float]:
    """The discriminator's ranking AUC (replaced over original tokens) and token-mean L_D on the held-out set.

    Runs in eval mode (no dropout, so no random numbers are drawn: a run's trajectory does not depend on
    whether or how often it is evaluated) and restores the previous mode.
    """
    was_training = discriminator.training
    discriminator.eval()
    replaced, original = [], []
    loss_sum = tokens = 0.0
    try:
        for start in range(0, len(heldout), batch_size):
            data = {name: t[start:start + batch_size] for name, t in heldout.tensors.items()}
            d = discriminator_losses(discriminator, data, autocast=autocast())
            real = d.mask.bool()
            replaced.append(d.logits[d.labels.bool() & real])
            original.append(d.logits[~d.labels.bool() & real])
            counts = d.mask.sum(1)
            loss_sum += float((d.per_example * counts).sum())
            tokens += float(counts.sum())
    finally:
        discriminator.train(was_training)
    scores = (ranking_auc(torch.cat(replaced), torch.cat(original)), loss_sum / tokens,
              base_rate_entropy(heldout.replaced_share))
    return dict(zip(HELDOUT_METRICS, scores))


@dataclass
class HeldoutConfig:
    """How a held-out file is made (`electra_tmr.py heldout`). The text, tokenizer, sequence length and masking
    come from the reference run's own config, so the file matches the runs it tests and no option is declared
    twice."""

    run: str = option("", "the reference pretraining run's output directory: its exported generator corrupts the "
                      "text; its corpus, cache, --max-len and mask rates are used", "held-out set")
    output: str = option("heldout.safetensors", "the file to write", "held-out set")
    start_line: int | None = option(None, "first non-blank corpus line to use (default: the run's --max-lines, the "
                                    "first line it never trained on)", "held-out set")
    examples: int = option(512, "packed examples to keep (at most)", "held-out set")
    seed: int = option(0, "seed of the masking and the generator's samples", "held-out set")


def make_heldout(config: HeldoutConfig) -> HeldoutSet:
    """Build and save the held-out file a `HeldoutConfig` describes (the ``heldout`` command)."""
    from transformers import ElectraForMaskedLM

    from ..tokenizer import load_tokenizer
    from ..data import corpus_lines, resolve_corpus
    from .config import saved_run_config

    run = saved_run_config(config.run, flag="--run")
    generator_dir = Path(config.run) / "generator"
    if not generator_dir.is_dir():
        raise UserError(f"--run: {config.run!r} has no exported generator (generator/); the reference run needs "
                        "--export-hf (the default)")
    start_line = run.max_lines if config.start_line is None else config.start_line
    if start_line is None:
        raise UserError(f"--start-line: the run {config.run!r} trained on the whole corpus (no --max-lines), so "
                        "give the first line to hold out")
    if start_line < 0:
        raise UserError(f"--start-line must be >= 0, got {start_line}")
    if config.examples < 1:
        raise UserError(f"--examples must be >= 1, got {config.examples}")
    tokenizer = load_tokenizer(str(generator_dir), need_mask=True)
    generator = ElectraForMaskedLM.from_pretrained(str(generator_dir))
    lines = list(corpus_lines(resolve_corpus(run.corpus, run.corpus_config), Path(run.cache_dir),
                              start=start_line)["text"])
    made = build_heldout_set(generator, tokenizer, lines, run.max_len, config.examples, run.mask_prob,
                             run.mask_token_prob, config.seed,
                             info={"generator": str(generator_dir.resolve()), "corpus": run.corpus,
                                   "start_line": start_line, "lines": len(lines)})
    made.save(config.output)
    return made
