"""Distributed pretraining on 2 CPU ranks (gloo): identical replicas, equivalence with one process, per-rank
shards, per-rank checkpoints, resume after a killed rank, and the world-size check.

The 2-rank runs are started once (`two_rank_runs`: spawned processes with torchrun's environment variables)
and read by several tests; the kill test launches real `torchrun` jobs.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import processes

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

from replayloader_electra.errors import UserError  # noqa: E402
from replayloader_electra.pretrain import PretrainConfig, pretrain, read_metrics, resume_config  # noqa: E402
from replayloader_electra.pretrain.checkpoint import check_world_size  # noqa: E402
from replayloader_electra.pretrain.heldout import (HeldoutConfig, HeldoutSet, evaluate_heldout,  # noqa: E402
                                                   make_heldout)

from .distributed_ranks import equivalence_run, run_ranks  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
STEPS = 20
DELAY = 3  # --delay-steps of the delay-line run


def run_settings(corpus: dict, out: Path, **overrides) -> dict:
    settings = dict(preset="tiny", corpus=corpus["file"], vocab_size=200, max_len=32, batch_size=8, steps=STEPS,
                    buffer_size=32, warmup_steps=2, output_dir=str(out), cache_dir=corpus["cache"], progress=False,
                    export_hf=False, device="cpu", dist_timeout=60.0)
    settings.update(overrides)
    return settings


@pytest.fixture(scope="module")
def two_rank_runs(corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("two_ranks")
    # the tokenizer and example cache, built once here; the warm run's generator corrupts a held-out file
    pretrain(PretrainConfig(**run_settings(corpus, root / "warm", steps=1, warmup_steps=0, export_hf=True)))
    heldout = root / "heldout.safetensors"
    make_heldout(HeldoutConfig(run=str(root / "warm"), output=str(heldout), start_line=1200, examples=8))
    jobs = [
        {"name": "electra", "kind": "pretrain", "args": {"config": run_settings(corpus, root / "electra",
                                                                                 variant="electra")}},
        {"name": "tmr", "kind": "pretrain", "args": {"config": run_settings(
            corpus, root / "tmr", variant="tmr-loss_diff", checkpoint_every=4, keep_checkpoints=10,
            export_hf=True, heldout=str(heldout), heldout_every=5)}},
        {"name": "equivalence", "kind": "equivalence"},
        {"name": "ghost", "kind": "ghost_norms", "args": {"config": run_settings(
            corpus, root / "ghost", variant="tmr-grad_norm", steps=4, dropout=0.0)}},
        {"name": "delay", "kind": "pretrain", "args": {"config": run_settings(
            corpus, root / "delay", variant="electra", delay_steps=DELAY, checkpoint_every=2, keep_checkpoints=20)}},
        {"name": "delay_resumed", "kind": "resumed", "args": {  # resumed while each rank's queue is still filling
            "checkpoint": str(root / "delay" / "checkpoints" / "step-00000002"),
            "output_dir": str(root / "delay_resumed")}},
    ]
    reports = run_ranks(2, jobs, root)
    return {"root": root, "reports": reports, "heldout": heldout}


@pytest.mark.parametrize("run", ["electra", "tmr", "delay"])
def test_parameters_are_bit_identical_on_both_ranks_after_every_step(two_rank_runs, run):
    for report in two_rank_runs["reports"]:
        assert report[run]["identical"] == [True] * STEPS


def test_two_ranks_with_half_batches_equal_one_process_with_the_whole_batch(two_rank_runs, one_torch_thread):
    single = equivalence_run()
    halves = [report["equivalence"] for report in two_rank_runs["reports"]]
    assert halves[0] == halves[1]  # replicas agree exactly
    for name, expected in single.items():
        got = torch.tensor(halves[0][name]).reshape(expected.shape)
        # measured: 6e-8 at most; 6e-3 without the loss shares
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6, msg=name)


def test_ghost_norms_under_ddp_equal_the_loop_reference_on_each_rank(two_rank_runs):
    for report in two_rank_runs["reports"]:
        differences = report["ghost"]["relative_differences"]
        assert len(differences) == 4 and max(differences) < 1e-5, differences  # measured <= 1.5e-7


def test_each_rank_samples_only_what_it_added_and_ranks_see_disjoint_text(two_rank_runs):
    reports = [report["tmr"] for report in two_rank_runs["reports"]]
    for report in reports:
        assert len(report["added"]) == STEPS * 4  # per-rank batch = 8 / 2
        assert set(report["sampled"]) <= set(report["added"])
    assert not set(reports[0]["added"]) & set(reports[1]["added"])


def test_checkpoint_holds_the_model_once_and_every_rank_state(two_rank_runs):
    step_dir = two_rank_runs["root"] / "tmr" / "checkpoints" / "step-00000004"
    names = sorted(p.name for p in step_dir.iterdir())
    assert names == ["rank-00000.json", "rank-00000.safetensors", "rank-00001.json", "rank-00001.safetensors",
                     "state.json", "tensors.safetensors"]
    assert json.loads((step_dir / "state.json").read_text())["world_size"] == 2
    assert not list((two_rank_runs["root"] / "tmr" / "checkpoints").glob(".tmp-*"))


def test_metrics_are_logged_once_per_step_with_every_rank_time(two_rank_runs):
    records = read_metrics(two_rank_runs["root"] / "tmr" / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert all(len(r["step_seconds_per_rank"]) == 2 and r["step_seconds"] == max(r["step_seconds_per_rank"])
               for r in records)


def test_rank_zero_scores_the_held_out_set_and_the_log_holds_its_numbers(two_rank_runs, one_torch_thread):
    from transformers import AutoTokenizer, ElectraForPreTraining

    records = read_metrics(two_rank_runs["root"] / "tmr" / "metrics.jsonl")
    assert [r["step"] for r in records if r.get("heldout_auc") is not None] == [5, 10, 15, 20]
    final = two_rank_runs["root"] / "tmr" / "discriminator"
    heldout = HeldoutSet.load(two_rank_runs["heldout"], AutoTokenizer.from_pretrained(str(final)))
    expected = evaluate_heldout(ElectraForPreTraining.from_pretrained(str(final)), heldout)
    for name, value in expected.items():  # the other rank's missing score does not dilute rank 0's
        assert records[-1][name] == pytest.approx(value, abs=1e-6), name


def test_a_delay_line_under_ddp_ages_every_rank_batch_and_resumes_mid_fill_exactly(two_rank_runs):
    """--delay-steps under 2 ranks: each rank queues its own corrupted batches (the checkpoint holds both ranks'
    queues), the logged age runs 0..D-1 while filling and D after, and a run resumed at step 2, with the queues
    half full, continues the uninterrupted run's losses exactly."""
    root = two_rank_runs["root"]
    straight = read_metrics(root / "delay" / "metrics.jsonl")
    assert [r["sample_age_mean"] for r in straight] == [min(step, DELAY) for step in range(STEPS)]
    resumed = read_metrics(root / "delay_resumed" / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [r["step"] for r in straight[2:]]
    for key in ("generator_loss", "discriminator_loss", "loss", "sample_age_mean"):
        assert [r[key] for r in resumed] == [r[key] for r in straight[2:]], key


def test_resuming_on_another_number_of_ranks_is_a_clear_error(two_rank_runs, tmp_path):
    step_dir = two_rank_runs["root"] / "tmr" / "checkpoints" / "step-00000004"
    config = resume_config(str(step_dir), output_dir=str(tmp_path / "one"), progress=False)
    with pytest.raises(UserError, match=r"written by 2 rank\(s\) but this run has 1.*torchrun with 2"):
        pretrain(config)
    with pytest.raises(UserError, match=r"written by 1 rank\(s\) but this run has 4.*plain python"):
        check_world_size(step_dir, {"world_size": 1}, 4)


def test_fine_tuning_loads_the_discriminator_of_a_distributed_run(two_rank_runs):
    from replayloader_electra.finetune.sources import load_checkpoint_tokenizer, load_encoder

    location = str(two_rank_runs["root"] / "tmr" / "discriminator")
    tokenizer, encoder = load_checkpoint_tokenizer(location), load_encoder(location)
    encoded = tokenizer(["the cat sat on the mat."], return_tensors="pt")
    assert encoder(**encoded).last_hidden_state.shape[:2] == encoded["input_ids"].shape


def torchrun(args: list[str], stdout=subprocess.DEVNULL):
    """A real torchrun job of the pretraining command, as a `tests.processes.job` block: whatever happens in
    the block, no process of the job outlives it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return processes.job([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                          "--monitor-interval=0.2", str(ROOT / "examples" / "electra_tmr.py"), "pretrain",
                          "--threads", "1", *args], env=env, stdout=stdout, stderr=subprocess.PIPE)


def pretrain_flags(corpus: dict, output_dir: str | Path, steps: int, checkpoint_every: int = 4) -> list[str]:
    """The command-line twin of `run_settings` (tmr-loss_diff) for a real torchrun job."""
    return ["--variant", "tmr-loss_diff", "--corpus", corpus["file"], "--vocab-size", "200", "--max-len", "32",
            "--batch-size", "8", "--steps", str(steps), "--buffer-size", "32", "--warmup-steps", "2",
            "--output-dir", str(output_dir), "--cache-dir", corpus["cache"], "--no-progress", "--no-export-hf",
            "--device", "cpu", "--dist-timeout", "60", "--checkpoint-every", str(checkpoint_every),
            "--keep-checkpoints", "10"]


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the rank processes through /proc")
def test_a_killed_rank_ends_the_job_and_resume_continues_it_exactly(two_rank_runs, corpus, tmp_path):
    settings = run_settings(corpus, tmp_path / "killed", variant="tmr-loss_diff", checkpoint_every=4,
                            keep_checkpoints=10)
    with torchrun(pretrain_flags(corpus, settings["output_dir"], STEPS)) as job:
        first = tmp_path / "killed" / "checkpoints" / "step-00000004"
        deadline = time.monotonic() + 120
        while not first.is_dir() and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert first.is_dir(), job.stderr.read().decode()[-2000:] if job.poll() is not None else "no checkpoint"
        ranks = children(job.pid)
        assert len(ranks) == 2, ranks
        os.kill(ranks[1], signal.SIGKILL)
        killed_at = time.monotonic()
        status = job.wait(timeout=90)
        assert status != 0
        assert time.monotonic() - killed_at < 60
    assert read_metrics(tmp_path / "killed" / "metrics.jsonl")[-1]["step"] < STEPS  # it really stopped early

    with torchrun(["--resume", settings["output_dir"], "--no-progress"], stdout=subprocess.PIPE) as resumed:
        output, errors = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, errors.decode()[-2000:]
    printed = output.decode().splitlines()
    assert sum(line.startswith("wrote ") for line in printed) == 1 and "{}" not in printed  # rank 0 alone speaks
    expected = read_metrics(two_rank_runs["root"] / "tmr" / "metrics.jsonl")
    got = read_metrics(tmp_path / "killed" / "metrics.jsonl")
    for key in ("generator_loss", "discriminator_loss", "loss", "sample_age_mean", "buffer_weight_mean"):
        assert [r[key] for r in got] == [r[key] for r in expected], key


def test_compare_under_torchrun_is_a_clear_error(monkeypatch, capsys):
    from replayloader_electra import cli

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli.main(["compare", "--steps", "1"]) == 2
    assert "under torchrun use the pretrain command" in capsys.readouterr().err


def test_a_global_batch_that_does_not_split_over_the_ranks_is_a_clear_error(monkeypatch):
    from replayloader_electra.pretrain.distributed import DistributedWorld, World

    world = World.__new__(DistributedWorld)  # the check needs no process group
    world.size = 3
    with pytest.raises(UserError, match=r"--batch-size 8 \(the global batch\) must be divisible by the number of "
                                        r"ranks 3"):
        world.per_rank(8, 1000)
    assert World().per_rank(8, 1000) == (8, 1000)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the rank processes through /proc")
def test_a_killed_launcher_stops_both_ranks_and_its_last_checkpoint_verifies(corpus, tmp_path):
    """torchrun puts each rank in a session of its own, so a SIGKILL to the launcher reaches no rank: before the
    watchdog both ranks went on training and writing into the output directory."""
    from replayloader_electra.pretrain.checkpoint import choose_checkpoint, newest_step_dir

    out = tmp_path / "orphaned"
    with torchrun(pretrain_flags(corpus, out, steps=100_000, checkpoint_every=2)) as job:
        deadline = time.monotonic() + 120
        while newest_step_dir(out / "checkpoints") is None and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert newest_step_dir(out / "checkpoints") is not None, job.stderr.read().decode()[-2000:] \
            if job.poll() is not None else "no checkpoint"
        ranks = children(job.pid)
        assert len(ranks) == 2, ranks
        os.kill(job.pid, signal.SIGKILL)
        job.wait()
        killed_at = time.monotonic()
        left = processes.wait_until_gone(job.tag, 30)
        assert not left, f"a rank outlived its launcher: {left}"
        assert time.monotonic() - killed_at < 5  # the watchdog polls every 0.5 s
        assert "its launcher (pid" in job.stderr.read().decode()  # the ranks say why they stop
    chosen = choose_checkpoint(out)
    assert chosen.step >= 2 and not chosen.skipped
