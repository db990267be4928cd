"""The python blocks of docs/mixing.md run as written (the DDP one under torchrun: tests/mixing/jobs.py)."""
import numpy as np
import pytest

from tests.docs_blocks import block


def run_block(after, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # blocks that write files write them here
    namespace: dict = {"__name__": "__main__"}
    exec(compile(block("docs/mixing.md", after), f"docs/mixing.md {after}", "exec"), namespace)
    return namespace


def test_the_plain_loop(monkeypatch, tmp_path, capsys):
    pytest.importorskip("torch")
    ns = run_block("## A plain loop", monkeypatch, tmp_path)
    weights = dict(zip(ns["stats"]["names"], ns["stats"]["weights"]))
    assert ns["stats"]["drawn"].sum() == 300 * 32 and ns["stats"]["feedback_calls"] == 300
    assert weights["curved"] > weights["noisy"] > weights["clean"]  # what the page says: loss, noise included
    assert "{'clean': 0.142, 'noisy': 0.319, 'curved': 0.539}" in capsys.readouterr().out


def test_the_dataloader(monkeypatch, tmp_path, capsys):
    pytest.importorskip("torch")
    ns = run_block("## In a DataLoader", monkeypatch, tmp_path)
    assert len(ns["loader"]) == 32 and ns["batches"].stats()["feedback_calls"] == 3 * 32
    assert ns["batches"].stats()["fed_back"].sum() == 3 * 32 * 32
    assert capsys.readouterr().out.startswith("32 96 [")


def test_the_streams(monkeypatch, tmp_path):
    pytest.importorskip("torch")
    ns = run_block("**Streams.**", monkeypatch, tmp_path)
    stats = ns["dataset"].stats()
    assert stats["feedback_calls"] == 100 and stats["passes"].sum() > 0
    assert np.argmax(stats["weights"]) == 2  # the source with the largest values has the largest "loss"


def test_the_hugging_face_trainer(monkeypatch, tmp_path):
    pytest.importorskip("transformers")
    ns = run_block("## Hugging Face Trainer", monkeypatch, tmp_path)
    assert ns["sampler"].stats()["feedback_calls"] == 20
    for step in (10, 20):
        assert (tmp_path / "mixing_run" / f"checkpoint-{step}" / "mixture_sampler.npz").is_file()


def test_the_checkpoint(monkeypatch, tmp_path, capsys):
    run_block("## Checkpoints", monkeypatch, tmp_path)
    assert capsys.readouterr().out.strip() == "True" and (tmp_path / "mixture.npz").is_file()
