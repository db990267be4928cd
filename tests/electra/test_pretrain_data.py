"""Corpus resolution, packing, caching and the batch stream of the pretraining data pipeline."""
from __future__ import annotations

import gzip
import zipfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")  # local corpora need no `datasets` (only a hub corpus does)

from replayloader_electra.errors import UserError  # noqa: E402
from replayloader_electra.data import (BatchStream, PackedExamples, pack_token_stream,  # noqa: E402
                                       prepare_pretraining_data, read_text_lines, resolve_corpus,
                                       text_files_for)

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def test_packing_makes_cls_body_sep_examples_of_max_len():
    lines = [[10, 11, 12], [13, 14], [15, 16, 17, 18, 19, 20, 21], [22, 23, 24]]
    examples, lengths = pack_token_stream(lines, max_len=6, cls_id=2, sep_id=3, pad_id=0, min_tail=2)
    assert examples[0] == [2, 10, 11, 12, 13, 3]
    assert all(len(e) == 6 and e[0] == 2 for e in examples)
    body = [t for e, n in zip(examples, lengths) for t in e[1:n - 1]]
    assert body == list(range(10, 25))  # every token once, in order
    assert examples[-1] == [2, 22, 23, 24, 3, 0] and lengths[-1] == 5  # short tail kept, padded
    dropped, _ = pack_token_stream([[10, 11, 12, 13, 14]], max_len=6, cls_id=2, sep_id=3, pad_id=0, min_tail=2)
    assert dropped == [[2, 10, 11, 12, 13, 3]]  # a 1-token tail (< min_tail) is dropped


def test_corpus_names_resolve_to_embedded_files_or_hub(tmp_path):
    assert resolve_corpus("python-docs").kind == "embedded"
    assert resolve_corpus("wikitext", "wikitext-103-raw-v1").kind == "hub"
    assert resolve_corpus("hub:some/dataset").name == "some/dataset"
    (tmp_path / "a.txt").write_text("hello world\n")
    with gzip.open(tmp_path / "b.txt.gz", "wt") as f:
        f.write("gzip text\n")
    spec = resolve_corpus(str(tmp_path))
    assert spec.kind == "files" and [Path(f).name for f in spec.files] == ["a.txt", "b.txt.gz"]
    with pytest.raises(UserError, match="not found"):
        resolve_corpus(str(tmp_path / "missing.txt"))
    with pytest.raises(UserError, match="unknown embedded"):
        resolve_corpus("embedded:nope")


def test_embedded_topics_corpus_builds_cached_memory_mapped_examples(tmp_path):
    data = prepare_pretraining_data("python-topics", tmp_path, vocab_size=500, max_len=64, max_lines=300)
    ids = np.asarray(data.examples[:5]["input_ids"])
    tok = data.tokenizer
    assert ids.shape == (5, 64) and (ids[:, 0] == tok.cls_token_id).all()
    lengths = np.asarray(data.examples[:5]["length"])
    assert all(ids[i, n - 1] == tok.sep_token_id for i, n in enumerate(lengths))
    assert isinstance(data.examples["input_ids"], np.memmap)  # .npy files on disk, memory-mapped
    assert all(f.is_file() for f in data.examples.files)
    assert data.examples["input_ids"].dtype == np.int16 and len(data.examples["length"]) == len(data)
    again = prepare_pretraining_data("python-topics", tmp_path, vocab_size=500, max_len=64, max_lines=300)
    assert again.cache_dir == data.cache_dir and len(again) == len(data)


def test_zip_archives_are_read_as_text_and_pos_tags_stripped(tmp_path):
    archive = tmp_path / "tagged.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("tagged/ca01", "The/at dog/nn ran/vbd ./.\n\nA/at cat/nn sat/vbd ./.\n")
        z.writestr("tagged/README", "not text of the corpus")
    [text_file] = text_files_for(resolve_corpus(str(archive)), tmp_path / "cache")
    assert Path(text_file).read_text() == "The dog ran .\nA cat sat .\n"


def test_batch_stream_position_round_trips():
    examples = {"input_ids": np.arange(40 * 4).reshape(40, 4) + 5}

    class Rows:  # the Arrow dataset's row access, in memory
        def __len__(self):
            return 40

        def __getitem__(self, rows):
            return {"input_ids": examples["input_ids"][rows]}

    stream = BatchStream(Rows(), batch_size=6, seed=3, pad_id=0)
    for _ in range(8):  # crosses an epoch boundary (6 full batches per epoch)
        next(stream)
    state = stream.state_dict()
    expected = [next(stream)["input_ids"] for _ in range(3)]
    other = BatchStream(Rows(), batch_size=6, seed=3, pad_id=0)
    other.load_state_dict(state)
    assert all((a == next(other)["input_ids"]).all() for a in expected)
    with pytest.raises(UserError, match="fewer than the batch size"):
        BatchStream(Rows(), batch_size=64, seed=0, pad_id=0)


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data is not available")
def test_shared_gz_and_nltk_zip_corpora(tmp_path):
    data = prepare_pretraining_data(str(SHARED / "wikitext-2" / "wiki.valid.tokens.gz"), tmp_path, vocab_size=800,
                                    max_len=64, max_lines=400)
    assert len(data) > 50
    [text_file] = text_files_for(resolve_corpus(str(SHARED / "nltk_data" / "corpora" / "inaugural.zip")), tmp_path)
    text = Path(text_file).read_text()
    assert "Fellow-Citizens" in text[:2000] and len(text) > 500_000


def test_trained_tokenizer_is_reproducible_and_keeps_special_ids():
    from replayloader_electra.tokenizer import SPECIAL_TOKENS, train_wordpiece

    rng = np.random.default_rng(0)
    words = [f"w{i}x{j}" for i in range(30) for j in range(5)]
    texts = [" ".join(rng.choice(words, size=12)) for _ in range(400)]
    first, second = train_wordpiece([texts], 300), train_wordpiece([texts], 300)
    assert first.get_vocab() == second.get_vocab()
    assert [first.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]


def test_local_text_is_read_as_the_datasets_text_builder_reads_it(tmp_path):
    """Universal newlines (\r\n and a lone \r end a line), only \n splits (not \u2028 or \x0c), no final
    newline needed, .gz decompressed: the lines `datasets.load_dataset("text")` gives, without `datasets`."""
    plain, packed = tmp_path / "a.txt", tmp_path / "b.txt.gz"
    plain.write_bytes("one\r\ntwo\rthree\u2028still three\x0cand\n\n  \nlast".encode())
    with gzip.open(packed, "wb") as f:
        f.write("gz line\r\n\nend\n".encode())
    lines = read_text_lines([str(plain), str(packed)])
    assert lines == ["one", "two", "three\u2028still three\x0cand", "", "  ", "last", "gz line", "", "end"]
    datasets = pytest.importorskip("datasets")
    loaded = datasets.load_dataset("text", data_files={"train": [str(plain), str(packed)]}, split="train",
                                   cache_dir=str(tmp_path / "hf"))
    assert list(loaded["text"]) == lines


def test_training_needs_no_datasets_for_local_text(tmp_path, monkeypatch):
    """A local corpus is read, packed, cached and reloaded with `datasets` unimportable."""
    import sys

    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` now raises ImportError
    (tmp_path / "corpus.txt").write_text("\n".join(f"line {i} of some text to pack" for i in range(300)))
    data = prepare_pretraining_data(str(tmp_path / "corpus.txt"), tmp_path / "cache", vocab_size=120, max_len=16)
    again = PackedExamples(data.examples.directory)
    assert len(again) == len(data) > 10 and (again[:3]["input_ids"] == data.examples[:3]["input_ids"]).all()
    stream = BatchStream(data.examples, batch_size=4, seed=0, pad_id=data.tokenizer.pad_token_id)
    assert next(stream)["input_ids"].shape == (4, 16)
