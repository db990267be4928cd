"""The python blocks of docs/prompts.md run as written, and say what the page says they say."""
from __future__ import annotations

import pytest

from tests.docs_blocks import block


def run_block(after, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # blocks that write files write them here
    namespace: dict = {"__name__": "__main__"}
    exec(compile(block("docs/prompts.md", after), f"docs/prompts.md {after}", "exec"), namespace)
    return namespace


def test_the_plain_loop(monkeypatch, tmp_path, capsys):
    ns = run_block("## A plain loop", monkeypatch, tmp_path)
    out = capsys.readouterr().out
    uniform, prioritized = ns["uniform"].stats(), ns["learnability"].stats()
    assert prioritized["frac_zero_variance_total"] < uniform["frac_zero_variance_total"] - 0.2
    assert out.startswith("zero-variance groups: uniform 0.")
    priors = ns["learnability"].prior_values()
    assert priors[1] > priors[0] and priors[1] > priors[4]  # the middle buckets carry the signal


def test_the_dataloader(monkeypatch, tmp_path, capsys):
    pytest.importorskip("torch")
    run_block("## In a GRPO trainer's DataLoader", monkeypatch, tmp_path)
    assert capsys.readouterr().out == "100 100 0\n"  # no accelerate look-ahead in a plain DataLoader: lag 0


def test_the_checkpoint(monkeypatch, tmp_path):
    pytest.importorskip("torch")
    ns = run_block("## Checkpoints", monkeypatch, tmp_path)
    assert (tmp_path / "prompts.npz").is_file() and len(ns["first"]) == 20


def test_the_baselines(monkeypatch, tmp_path, capsys):
    ns = run_block("## Baselines", monkeypatch, tmp_path)
    out = capsys.readouterr().out.splitlines()
    assert ns["dynamic"].kept == 16 and ns["generated"] >= 24  # ceil(16 × 1.5) first; the surplus trimmed
    assert out[0].endswith(f"groups generated for {ns['dynamic'].kept} with signal")
    assert out[1] == "[False  True]"


def run_trl_blocks(monkeypatch, tmp_path, *then):
    """The TRL section's block (and then the blocks after ``then``, in its namespace) on one torch thread."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("trl")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ns = run_block("## With TRL: PrioritizedGRPOTrainer", monkeypatch, tmp_path)
        for after in then:
            exec(compile(block("docs/prompts.md", after), f"docs/prompts.md {after}", "exec"), ns)
    finally:
        torch.set_num_threads(threads)
    return ns


def test_the_trl_trainer(monkeypatch, tmp_path, capsys):
    ns = run_trl_blocks(monkeypatch, tmp_path)
    calls, trl_share, sampler_share = capsys.readouterr().out.splitlines()[-1].split()
    assert int(calls) == 8 and float(trl_share) == float(sampler_share)
    assert (tmp_path / "grpo-out" / "checkpoint-4" / "prompt_sampler.npz").is_file()
    resumed = ns["PrioritizedGRPOTrainer"](model=ns["model"], reward_funcs=ns["exact_start"], args=ns["args"],
                                           train_dataset=ns["prompts"], processing_class=ns["tokenizer"],
                                           prompt_sampler=ns["PromptSampler"](30, 2, group_size=8,
                                                                             labels=ns["counts"], retest_every=10))
    resumed.train(resume_from_checkpoint="grpo-out/checkpoint-4")  # the page's resume line works as written
    assert resumed.prompt_sampler.stats()["feedback_calls"] == 8


def test_the_dapo_trainer_runs_on_the_trl_sections_objects(monkeypatch, tmp_path, capsys):
    ns = run_trl_blocks(monkeypatch, tmp_path, "### DAPO inside TRL: DynamicSamplingGRPOTrainer")
    stats = ns["dynamic"].stats()
    assert stats["kept"] == 16 and stats["groups"] == stats["kept"] + stats["dropped"] + stats["trimmed"]
    assert capsys.readouterr().out.splitlines()[-1] == f"{stats['groups']} groups generated, 16 trained on"
    assert (tmp_path / "grpo-out" / "checkpoint-8" / "dynamic_sampling.npz").is_file()


def test_the_verl_config_lines_name_the_class():
    pytest.importorskip("torch")
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "prompts.md").read_text()
    assert "data.sampler.class_path=pkg://replayloader.prompts.verl" in text
    from replayloader.prompts import verl

    assert "data.sampler.class_name=VerlPromptSampler" in text and hasattr(verl, "VerlPromptSampler")
