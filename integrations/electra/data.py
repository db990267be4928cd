r"""Corpus -> WordPiece tokenizer -> packed [CLS] ... [SEP] examples, cached on disk as memory-mapped numpy arrays.

Local text needs no `datasets`: text files (``.txt``, ``.gz``, ``.tokens``, ``.raw``; NLTK-style ``.zip``
archives are first written out as plain text in the cache) and the embedded corpora are read line by line by
`read_text_lines`, with the line rules of `datasets`' ``"text"`` builder (universal newlines, one line per
``\n``), into a `table.Columns`. Only a hub corpus (``hub:wikitext`` with a config, when online) loads through
`datasets.load_dataset`. Either way the lines are tokenised and packed here, in batches of 1000 lines, and the
examples are saved as two ``.npy`` files (`PackedExamples`), so training reads them without `datasets` too.

The embedded default corpus, ``python-docs``, is the documentation that CPython ships: the help topics of
``pydoc_data.topics`` plus the docstrings of the standard-library sources (PSF-licensed, ~2 MB of English prose with
some code), frozen as a versioned snapshot in ``integrations/electra/corpus`` (a ``.gz`` file, its digest checked
on every load) so that every machine trains on the same text. It needs no download and no data directory.
"""
from __future__ import annotations

import codecs
import glob
import gzip
import hashlib
import json
import os
import re
import shutil
import time
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import UserError  # noqa: F401
from .tokenizer import SPECIAL_TOKENS, load_tokenizer, train_wordpiece  # noqa: F401
from .corpus import manifest, snapshot_file
from .runtime import to_device
from .table import Columns

EMBEDDED_CORPORA = tuple(manifest())  # python-docs, python-topics: the frozen snapshots
TEXT_SUFFIXES = (".txt", ".txt.gz", ".gz", ".tokens", ".raw", ".zip")
CACHE_FORMAT = 4  # bump when the cached example layout changes (4: numpy arrays instead of Arrow)
LEAKY_FILES = ("squad-dev-articles",)


@dataclass(frozen=True)
class CorpusSpec:
    """Where text comes from: ``kind`` is "embedded", "files" or "hub"."""

    kind: str
    name: str
    files: tuple[str, ...] = ()
    config: str | None = None

    def fingerprint(self) -> dict:
        """What identifies the corpus contents for the cache key (file sizes and mtimes, Python version)."""
        out: dict[str, Any] = {"kind": self.kind, "name": self.name, "config": self.config}
        if self.kind == "files":
            out["files"] = [(f, os.path.getsize(f), int(os.path.getmtime(f))) for f in self.files]
        if self.kind == "embedded":  # the frozen snapshot's text digest (verified on every call)
            out["snapshot_sha256"] = snapshot_file(self.name)[1]
        return out


def resolve_corpus(corpus: str, config: str | None = None) -> CorpusSpec:
    """Interpret a ``--corpus`` value: an embedded name, ``hub:NAME``, or comma-separated files/dirs/globs.

    Anything that is not an embedded name, not ``hub:``-prefixed and does not look like a path is taken as a hub
    dataset name, so ``wikitext`` with ``--corpus-config wikitext-103-raw-v1`` works when online.
    """
    corpus = corpus.strip()
    if not corpus:
        raise UserError("--corpus is empty")
    name = corpus[len("embedded:"):] if corpus.startswith("embedded:") else corpus
    if name in EMBEDDED_CORPORA:
        return CorpusSpec("embedded", name)
    if corpus.startswith("embedded:"):
        raise UserError(f"unknown embedded corpus {name!r}; choose one of {', '.join(EMBEDDED_CORPORA)}")
    if corpus.startswith("hub:"):
        return CorpusSpec("hub", corpus[4:], config=config)
    parts = [p for p in corpus.split(",") if p]
    looks_local = any(os.path.exists(p) or "/" in p or "*" in p or p.endswith(TEXT_SUFFIXES) for p in parts)
    if not looks_local:
        return CorpusSpec("hub", corpus, config=config)
    files: list[str] = []
    for part in parts:
        matches = sorted(glob.glob(os.path.expanduser(part), recursive=True))
        if not matches:
            raise UserError(f"corpus file not found: {part} (for a hub dataset with a '/' use hub:{part})")
        for match in matches:
            if os.path.isdir(match):
                found = sorted(str(p) for p in Path(match).rglob("*") if p.is_file() and p.name.endswith(TEXT_SUFFIXES))
                if not found:
                    raise UserError(f"corpus directory has no text files ({', '.join(TEXT_SUFFIXES)}): {match}")
                files.extend(found)
            else:
                files.append(match)
    files = [os.path.abspath(f) for f in files]
    for f in files:
        if any(leak in os.path.basename(f) for leak in LEAKY_FILES):
            warnings.warn(f"{os.path.basename(f)} is the SQuAD dev context text: do not evaluate on SQuAD dev, "
                          "XQuAD or QNLI after pretraining on it", stacklevel=2)
    return CorpusSpec("files", corpus, tuple(files))


# ----------------------------------------------------------------------------- materialising inputs as text
def _zip_to_text(path: str, out_dir: Path) -> str:
    """Write the text members of an archive (e.g. an NLTK corpus zip) as one plain text file.

    POS-tagged corpora (Brown: ``word/tag``) are detected and their tags stripped.
    """
    out = out_dir / (Path(path).name + ".txt")
    if out.exists():
        return str(out)
    tmp = out.with_suffix(".tmp")
    with zipfile.ZipFile(path) as archive, open(tmp, "w", encoding="utf-8") as sink:
        for member in sorted(archive.namelist()):
            base = member.rsplit("/", 1)[-1]
            if member.endswith("/") or base.upper().startswith(("README", "LICENSE", "CATS", "CONTENTS")):
                continue
            text = archive.read(member).decode("utf-8", errors="replace")
            tokens = text.split()
            if tokens and sum("/" in t for t in tokens) > 0.8 * len(tokens):
                text = re.sub(r"(\S+)/\S+", r"\1", text)
            for line in text.splitlines():
                line = " ".join(line.split())
                if line:
                    sink.write(line + "\n")
    tmp.rename(out)
    return str(out)


def text_files_for(spec: CorpusSpec, cache_dir: Path) -> list[str]:
    """Local plain-text (or .gz) files holding the corpus; archives and embedded text are written to the cache."""
    text_dir = cache_dir / "text"
    text_dir.mkdir(parents=True, exist_ok=True)
    if spec.kind == "embedded":
        return [str(snapshot_file(spec.name)[0])]
    files = []
    for f in spec.files:
        if f.endswith(".zip"):
            if not zipfile.is_zipfile(f):
                raise UserError(f"not a valid zip archive: {f}")
            files.append(_zip_to_text(f, text_dir))
        else:
            check_text_file(f)
            files.append(f)
    return files


def check_text_file(path: str, chunk_bytes: int = 1 << 20) -> None:
    """`UserError` naming ``path`` unless it is UTF-8 text with at least one non-blank line (``.gz``: once
    decompressed). Read once in chunks before the lines are read, so that a bad file is named with the byte
    offset of its first problem."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, has_text = 0, False
    try:
        with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as stream:
            while chunk := stream.read(chunk_bytes):
                nul = chunk.find(b"\0")
                if nul >= 0:
                    raise UserError(f"corpus file {path} is binary, not text (a NUL byte at byte offset {offset + nul})")
                try:
                    has_text = bool(decoder.decode(chunk).strip()) or has_text
                except UnicodeDecodeError as exc:
                    raise UserError(f"corpus file {path} is not UTF-8 text: byte 0x{exc.object[exc.start]:02x} at byte "
                                    f"offset {offset + exc.start - len(decoder.getstate()[0])} cannot be decoded "
                                    f"({exc.reason})") from None
                offset += len(chunk)
            decoder.decode(b"", final=True)
    except UnicodeDecodeError as exc:
        raise UserError(f"corpus file {path} is not UTF-8 text: it ends inside a character ({exc.reason})") from None
    except (OSError, EOFError) as exc:
        raise UserError(f"cannot read corpus file {path}: {exc}") from None
    if not has_text:
        raise UserError(f"corpus file {path} has no text: it is empty or holds only blank lines")


def read_text_lines(files: list[str]) -> list[str]:
    r"""Every line of the files, in order, without its line break: text mode's universal newlines (``\r\n`` and
    ``\r`` read as ``\n``), split on ``\n`` alone, the lines `datasets`' ``"text"`` builder gives. ``.gz`` files
    are decompressed. Blank lines are kept (`corpus_lines` drops them)."""
    lines: list[str] = []
    for path in files:
        try:
            with (gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz")
                  else open(path, encoding="utf-8")) as stream:
                lines.extend(line[:-1] if line.endswith("\n") else line for line in stream)
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read corpus file {path}: {exc}") from None
    return lines


def load_text_dataset(spec: CorpusSpec, cache_dir: Path):
    """The corpus as a table with one string column ``text``: a `Columns` read by `read_text_lines` for local
    and embedded text (no `datasets`), a `datasets.Dataset` for a hub corpus."""
    if spec.kind != "hub":
        return Columns({"text": read_text_lines(text_files_for(spec, cache_dir))})
    import datasets

    datasets.disable_progress_bars()
    try:
        ds = datasets.load_dataset(spec.name, spec.config, split="train", cache_dir=str(cache_dir / "hf_datasets"))
    except Exception as exc:  # the hub raises many types; the user needs one line
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"cannot load hub dataset {spec.name!r}"
                        f"{' config ' + repr(spec.config) if spec.config else ''}: {msg}") from None
    columns = [name for name, feature in ds.features.items() if getattr(feature, "dtype", None) == "string"]
    if not columns:
        raise UserError(f"hub dataset {spec.name!r} has no string column to pretrain on")
    column = "text" if "text" in columns else columns[0]
    ds = ds.select_columns([column])
    return ds if column == "text" else ds.rename_column(column, "text")


def corpus_lines(spec: CorpusSpec, cache_dir: Path, start: int = 0, stop: int | None = None):
    """The corpus's non-blank lines ``start:stop`` as a ``text`` table: what ``--max-lines N`` trains on is
    ``stop=N``, and ``start=N`` is the text such a run never saw (the held-out set's source)."""
    text = load_text_dataset(spec, cache_dir)
    if isinstance(text, Columns):
        lines = [t for t in text["text"] if t and t.strip()]
        stop = len(lines) if stop is None else min(stop, len(lines))
        return Columns({"text": lines[min(start, stop):stop]})
    text = text.filter(lambda batch: [bool(t and t.strip()) for t in batch["text"]], batched=True)
    stop = len(text) if stop is None else min(stop, len(text))
    return text if (start, stop) == (0, len(text)) else text.select(range(min(start, stop), stop))


# ----------------------------------------------------------------------------- packing
def pack_token_stream(token_lists: list[list[int]], max_len: int, cls_id: int, sep_id: int, pad_id: int,
                      min_tail: int) -> tuple[list[list[int]], list[int]]:
    """Concatenate lines of token ids and cut them into [CLS] <= max_len-2 tokens [SEP] examples.

    The last, shorter piece is kept (padded) when it has at least ``min_tail`` tokens, else dropped.
    Returns (padded ids, lengths).
    """
    body = max_len - 2
    stream = [t for ids in token_lists for t in ids]
    examples, lengths = [], []
    for start in range(0, len(stream), body):
        piece = stream[start:start + body]
        if len(piece) < body and len(piece) < min_tail:
            break
        ids = [cls_id, *piece, sep_id]
        lengths.append(len(ids))
        examples.append(ids + [pad_id] * (max_len - len(ids)))
    return examples, lengths


class PackedExamples:
    """The packed examples of one cache entry, memory-mapped: ``input_ids`` (n, max_len) and ``length`` (n,), saved
    as ``input_ids.npy`` and ``length.npy``. ``examples[rows]`` is a dict of both for those rows (an int, a slice or
    an index array), ``examples["input_ids"]`` a whole column."""

    FILES = ("input_ids", "length")

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        try:
            self.columns = {name: np.load(self.directory / f"{name}.npy", mmap_mode="r") for name in self.FILES}
        except (OSError, ValueError) as exc:
            raise UserError(f"the example cache {self.directory} is damaged ({exc}); delete it to rebuild") from None
        if len(self.columns["input_ids"]) != len(self.columns["length"]):
            raise UserError(f"the example cache {self.directory} is damaged (input_ids and length differ in "
                            "length); delete it to rebuild")

    @staticmethod
    def save(directory: str | os.PathLike, input_ids: np.ndarray, length: np.ndarray) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        np.save(directory / "input_ids.npy", input_ids)
        np.save(directory / "length.npy", length)

    @property
    def files(self) -> list[Path]:
        return [self.directory / f"{name}.npy" for name in self.FILES]

    def __len__(self) -> int:
        return len(self.columns["length"])

    def __getitem__(self, key):
        if isinstance(key, str):
            return self.columns[key]
        return {name: column[key] for name, column in self.columns.items()}


@dataclass
class PretrainingData:
    """Packed examples (`PackedExamples`, memory-mapped: ``input_ids`` (n, max_len), ``length``) and their tokenizer."""

    examples: PackedExamples
    tokenizer: Any
    tokenizer_dir: str
    cache_dir: str
    max_len: int
    prepare_seconds: float

    def __len__(self) -> int:
        return len(self.examples)

    @property
    def num_tokens(self) -> int:
        return int(np.asarray(self.examples["length"]).sum())


def prepare_pretraining_data(corpus: str, cache_dir: str | os.PathLike, vocab_size: int, max_len: int,
                             corpus_config: str | None = None, tokenizer_path: str | None = None,
                             max_lines: int | None = None) -> PretrainingData:
    """Build (or reuse from the cache) the tokenizer and the packed examples for a corpus."""
    if max_len < 8:
        raise UserError(f"max_len must be at least 8, got {max_len}")
    started = time.perf_counter()
    cache_root = Path(cache_dir)
    spec = resolve_corpus(corpus, corpus_config)
    key_source = {"format": CACHE_FORMAT, "corpus": spec.fingerprint(), "vocab_size": vocab_size,
                  "max_len": max_len, "max_lines": max_lines,
                  "tokenizer": _dir_digest(tokenizer_path) if tokenizer_path else None}
    key = hashlib.sha1(json.dumps(key_source, sort_keys=True).encode()).hexdigest()[:16]
    entry = cache_root / "examples" / key
    examples_dir, tokenizer_dir = entry / "examples", entry / "tokenizer"
    if not examples_dir.exists():
        text = corpus_lines(spec, cache_root, stop=max_lines)
        if len(text) == 0:
            raise UserError(f"corpus {corpus!r} is empty (no non-blank lines)")
        if tokenizer_path:
            tokenizer = load_tokenizer(tokenizer_path, need_mask=True)
        else:
            tokenizer = train_wordpiece((text[i:i + 1000]["text"] for i in range(0, len(text), 1000)), vocab_size)
        tmp = entry.with_name(entry.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tokenizer.save_pretrained(str(tmp / "tokenizer"))
        input_ids, lengths = _tokenize_and_pack(text, tokenizer, max_len)
        if len(lengths) == 0:
            raise UserError(f"corpus {corpus!r} is too small to make a single example of {max_len} tokens")
        PackedExamples.save(tmp / "examples", input_ids, lengths)
        (tmp / "source.json").write_text(json.dumps(key_source, indent=1))
        if entry.exists():  # another process won the race; keep its copy
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.rename(entry)
    tokenizer = load_tokenizer(str(tokenizer_dir), need_mask=True)
    return PretrainingData(PackedExamples(examples_dir), tokenizer, str(tokenizer_dir), str(entry), max_len,
                           time.perf_counter() - started)


def _tokenize_and_pack(text, tokenizer, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokenise lines in batches of 1000 (the fast tokenizer's batch path) and pack each batch into examples:
    (input_ids (n, max_len), length (n,)), int16 where the vocabulary and length fit, else int32."""
    cls_id, sep_id, pad_id = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id
    id_type = np.int16 if len(tokenizer) < 2 ** 15 else np.int32
    length_type = np.int16 if max_len < 2 ** 15 else np.int32
    ids_parts, length_parts = [np.zeros((0, max_len), id_type)], [np.zeros(0, length_type)]
    for start in range(0, len(text), 1000):
        encodings = tokenizer.backend_tokenizer.encode_batch(text[start:start + 1000]["text"], add_special_tokens=False)
        examples, lengths = pack_token_stream([e.ids for e in encodings], max_len, cls_id, sep_id, pad_id,
                                              min_tail=max_len // 4)
        if examples:
            ids_parts.append(np.asarray(examples, dtype=id_type))
            length_parts.append(np.asarray(lengths, dtype=length_type))
    return np.concatenate(ids_parts), np.concatenate(length_parts)


def _dir_digest(path: str) -> str:
    """Content hash of a tokenizer directory (so a changed tokenizer invalidates the example cache)."""
    digest = hashlib.sha1()
    root = Path(path)
    if not root.is_dir():
        raise UserError(f"tokenizer directory not found: {path}")
    for f in sorted(root.rglob("*")):
        if f.is_file():
            digest.update(f.name.encode())
            digest.update(f.read_bytes())
    return digest.hexdigest()


# ----------------------------------------------------------------------------- batches for the producer
class BatchStream:
    """Endless shuffled mini-batches of packed examples with a checkpointable position.

    Epoch ``e`` visits the examples in the order ``default_rng([seed, e]).permutation(n)``; the last partial
    batch of an epoch is dropped. State is (epoch, position) only, so resuming needs no saved permutation.
    With ``shard=(rank, ranks)`` the stream reads every ``ranks``-th entry of that permutation from ``rank`` on
    (trimmed to a multiple of ``ranks``): the ranks of a distributed run share the permutation and see disjoint
    examples in every epoch; ``(0, 1)`` is the whole permutation.
    """

    def __init__(self, examples: Any, batch_size: int, seed: int, pad_id: int, device: torch.device | str = "cpu",
                 shard: tuple[int, int] = (0, 1)):
        rank, ranks = shard
        if not 0 <= rank < ranks:
            raise ValueError(f"shard must be (rank, ranks) with 0 <= rank < ranks, got {shard}")
        if len(examples) // ranks < batch_size:
            raise UserError(f"corpus has {len(examples)} packed examples, fewer than the batch size {batch_size} "
                            f"per rank ({ranks} rank(s)); use more text, a smaller --batch-size or a smaller "
                            "--max-len")
        self.shard = (rank, ranks)
        self.examples = examples
        self.batch_size = batch_size
        self.seed = seed
        self.pad_id = pad_id
        self.device = torch.device(device)
        self.epoch = 0
        self.position = 0
        self.last_seconds = 0.0  # time the latest batch took to read
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        rank, ranks = self.shard
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.examples))
        return order[:len(order) - len(order) % ranks][rank::ranks]

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        started = time.perf_counter()
        batch = self._next_batch()
        self.last_seconds = time.perf_counter() - started
        return batch

    def _next_batch(self) -> dict[str, torch.Tensor]:
        if self.position + self.batch_size > len(self._order):
            self.epoch += 1
            self.position = 0
            self._order = self._permutation(self.epoch)
        rows = self._order[self.position:self.position + self.batch_size]
        self.position += self.batch_size
        ids = torch.from_numpy(np.asarray(self.examples[rows]["input_ids"], dtype=np.int64))
        ids = to_device(ids, self.device)
        return {"input_ids": ids, "attention_mask": (ids != self.pad_id).long()}

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "n": len(self.examples),
                "shard": list(self.shard)}

    def load_state_dict(self, state: dict) -> None:
        if int(state["n"]) != len(self.examples) or int(state["seed"]) != self.seed:
            raise UserError("checkpoint was made on different data (example count or seed differ)")
        if tuple(int(x) for x in state.get("shard", (0, 1))) != self.shard:
            raise UserError(f"checkpoint holds data shard {tuple(state['shard'])} (rank, ranks), this stream is "
                            f"shard {self.shard}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._permutation(self.epoch)
