"""Data for the online-data-mixing experiment (issue 29): six English text sources from local files.

Sources (all under the data root, ``$REPLAYLOADER_DATA`` or ``--data-dir``; see that folder's README.md):

| source          | files                                                             | document            |
|-----------------|-------------------------------------------------------------------|---------------------|
| wikipedia       | wikipedia-squad/squad-train-articles.part{1,2}of2.txt.gz          | one article         |
| abc_news        | nltk_data/corpora/abc.zip (rural.txt, science.txt)                | one story (blank-line separated) |
| brown_fiction   | nltk_data/corpora/brown.zip, genres adventure, fiction, humor, mystery, romance, science_fiction (tags stripped) | one Brown file |
| brown_nonfiction| nltk_data/corpora/brown.zip, every other genre (news, editorial, reviews, religion, hobbies, lore, belles_lettres, government, learned; tags stripped) | one Brown file |
| webtext         | nltk_data/corpora/webtext.zip (firefox, grail, overheard, pirates, singles, wine) | 25 consecutive non-empty lines of one file |
| speeches        | nltk_data/corpora/state_union.zip + inaugural.zip                 | one address         |

Held-out rule (fixed, the same for every source): documents are numbered 0, 1, 2, ... in the order above (files in
sorted name order, documents in file order); document ``i`` is held out when ``i % 10 == 9`` (10% of each source's
documents, spread over its files). Nothing held out is ever trained on, and the tokenizer is trained on the
training documents only.

Tokenization: a byte-level BPE (``tokenizers.ByteLevelBPETokenizer``, vocabulary 4096, special token
``<|endoftext|>``) trained on the training documents of all six sources. Each source's training documents are
tokenized, joined with ``<|endoftext|>`` and cut into non-overlapping blocks of ``block`` tokens (the remainder is
dropped); one example = one block. The held-out documents are cut the same way, and ``EVAL_BLOCKS`` blocks per
source, evenly spaced over its held-out blocks, form the fixed evaluation set.

Everything is cached under ``runs/mixing/data`` (``prepare`` rebuilds only what is missing).
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import zipfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / "runs" / "mixing" / "data"
DATA_ENV = "REPLAYLOADER_DATA"
SOURCES = ["wikipedia", "abc_news", "brown_fiction", "brown_nonfiction", "webtext", "speeches"]
FICTION = {"adventure", "fiction", "humor", "mystery", "romance", "science_fiction"}
HELDOUT_EVERY = 10  # document i is held out when i % 10 == 9
VOCAB = 4096
BLOCK = 128
EVAL_BLOCKS = 64
EOT = "<|endoftext|>"
WEBTEXT_LINES = 25


def data_root(data_dir: str | None = None) -> Path:
    root = data_dir or os.environ.get(DATA_ENV)
    if not root:
        raise SystemExit(f"no data root: pass --data-dir or set {DATA_ENV} (a folder holding nltk_data/ and wikipedia-squad/)")
    return Path(root)


def _decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _zip_texts(path: Path, prefix: str):
    with zipfile.ZipFile(path) as zf:
        for name in sorted(zf.namelist()):
            if name.endswith("/") or not name.startswith(prefix) or name.rsplit("/", 1)[-1] in {"README", "cats.txt", "CONTENTS"}:
                continue
            yield name, _decode(zf.read(name))


def _documents_wikipedia(root: Path) -> list[str]:
    docs = []
    for part in ("part1of2", "part2of2"):
        with gzip.open(root / "wikipedia-squad" / f"squad-train-articles.{part}.txt.gz", "rt", encoding="utf-8") as f:
            text = f.read()
        docs += [d.strip() for d in re.split(r"\n\s*\n", text) if d.strip()]
    return docs


def _documents_abc(root: Path) -> list[str]:
    docs = []
    for _, text in _zip_texts(root / "nltk_data" / "corpora" / "abc.zip", "abc/"):
        docs += [d.strip() for d in re.split(r"\n\s*\n", text) if d.strip()]
    return docs


def _untag(text: str) -> str:
    paras = []
    for para in re.split(r"\n\s*\n", text):
        words = [tok.rsplit("/", 1)[0] for tok in para.split()]
        words = ['"' if w in ("``", "''") else w for w in words]
        if words:
            paras.append(" ".join(words))
    return "\n".join(paras)


def _documents_brown(root: Path, fiction: bool) -> list[str]:
    path = root / "nltk_data" / "corpora" / "brown.zip"
    with zipfile.ZipFile(path) as zf:
        cats = dict(line.split()[:2] for line in zf.read("brown/cats.txt").decode().splitlines() if line.strip())
        names = sorted(n for n in zf.namelist() if n.rsplit("/", 1)[-1] in cats)
        return [_untag(_decode(zf.read(n))) for n in names if (cats[n.rsplit("/", 1)[-1]] in FICTION) == fiction]


def _documents_webtext(root: Path) -> list[str]:
    docs = []
    for _, text in _zip_texts(root / "nltk_data" / "corpora" / "webtext.zip", "webtext/"):
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        docs += ["\n".join(lines[i:i + WEBTEXT_LINES]) for i in range(0, len(lines), WEBTEXT_LINES)]
    return docs


def _documents_speeches(root: Path) -> list[str]:
    docs = []
    for z in ("state_union", "inaugural"):
        docs += [t.strip() for _, t in _zip_texts(root / "nltk_data" / "corpora" / f"{z}.zip", f"{z}/")]
    return docs


def documents(root: Path) -> dict[str, list[str]]:
    return {
        "wikipedia": _documents_wikipedia(root),
        "abc_news": _documents_abc(root),
        "brown_fiction": _documents_brown(root, True),
        "brown_nonfiction": _documents_brown(root, False),
        "webtext": _documents_webtext(root),
        "speeches": _documents_speeches(root),
    }


def split(docs: list[str]) -> tuple[list[str], list[str]]:
    train = [d for i, d in enumerate(docs) if i % HELDOUT_EVERY != HELDOUT_EVERY - 1]
    held = [d for i, d in enumerate(docs) if i % HELDOUT_EVERY == HELDOUT_EVERY - 1]
    return train, held


def _blocks(tok, docs: list[str], eot_id: int, block: int) -> np.ndarray:
    ids: list[int] = []
    for enc in tok.encode_batch(docs):
        ids += enc.ids
        ids.append(eot_id)
    n = len(ids) // block
    return np.asarray(ids[: n * block], dtype=np.int16 if VOCAB <= 32767 else np.int32).reshape(n, block)


def prepare(data_dir: str | None = None, cache: Path = CACHE, block: int = BLOCK, eval_blocks: int = EVAL_BLOCKS) -> dict:
    """Build (or load) the tokenized cache; returns its meta dict."""
    meta_path = cache / "meta.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta["block"] == block and meta["eval_blocks"] == eval_blocks:
            return meta
    from tokenizers import ByteLevelBPETokenizer

    root = data_root(data_dir)
    cache.mkdir(parents=True, exist_ok=True)
    docs = documents(root)
    splits = {s: split(docs[s]) for s in SOURCES}
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator((d for s in SOURCES for d in splits[s][0]), vocab_size=VOCAB, min_frequency=2,
                            special_tokens=[EOT], show_progress=False)
    tok.save(str(cache / "tokenizer.json"))
    eot_id = tok.token_to_id(EOT)
    meta = {"block": block, "eval_blocks": eval_blocks, "vocab_size": tok.get_vocab_size(), "eot_id": eot_id,
            "heldout_rule": f"document i held out when i % {HELDOUT_EVERY} == {HELDOUT_EVERY - 1}", "sources": {}}
    for s in SOURCES:
        train, held = splits[s]
        tr = _blocks(tok, train, eot_id, block)
        he = _blocks(tok, held, eot_id, block)
        pick = np.unique(np.linspace(0, len(he) - 1, num=min(eval_blocks, len(he))).round().astype(int))
        ev = he[pick]
        np.save(cache / f"{s}.train.npy", tr)
        np.save(cache / f"{s}.eval.npy", ev)
        meta["sources"][s] = {"docs": len(docs[s]), "train_docs": len(train), "heldout_docs": len(held),
                              "train_chars": sum(map(len, train)), "train_blocks": int(len(tr)),
                              "heldout_blocks": int(len(he)), "eval_blocks": int(len(ev)),
                              "train_sha256": hashlib.sha256(tr.tobytes()).hexdigest()[:16],
                              "eval_sha256": hashlib.sha256(ev.tobytes()).hexdigest()[:16]}
    meta_path.write_text(json.dumps(meta, indent=1))
    return meta


def load(cache: Path = CACHE) -> tuple[dict, list[np.ndarray], list[np.ndarray]]:
    meta = json.loads((cache / "meta.json").read_text())
    train = [np.load(cache / f"{s}.train.npy") for s in SOURCES]
    evals = [np.load(cache / f"{s}.eval.npy") for s in SOURCES]
    return meta, train, evals


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=None, help=f"data root (default: ${DATA_ENV})")
    args = ap.parse_args(argv)
    meta = prepare(args.data_dir)
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
