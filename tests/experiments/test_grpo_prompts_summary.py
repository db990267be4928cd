"""The GRPO prompt study's summary (experiments/grpo_prompts_summary.py) on synthetic records whose answers are
known: time to target with the two-evaluation window, censoring, Holm's adjustment, the PARTIAL rule and the
secondaries' table."""
from __future__ import annotations

import gzip
import json

import pytest

pytest.importorskip("scipy")

from experiments import grpo_prompts_summary as summary  # noqa: E402


def write_record(path, accs, *, seconds_per_eval=10.0, finished=True, zero=0.5, gz=False):
    """A record whose evaluation i (every 25 steps) is at cpu = i * seconds_per_eval with acc_2_5 = accs[i]."""
    rows = [{"type": "meta", "arm": path.stem.split("-")[0]}]
    for i, acc in enumerate(accs):
        if i:
            rows.append({"type": "step", "step": 25 * i, "cpu": i * seconds_per_eval, "sampler_cpu": 0.01})
            rows.append({"type": "log", "step": 25 * i, "frac_reward_zero_std": zero})
        rows.append({"type": "eval", "step": 25 * i, "cpu": i * seconds_per_eval, "clock": 3 * i * seconds_per_eval,
                     "tokens": 1000 * i, "acc_2_5": acc, "acc_d5": acc / 2})
    if finished:
        rows.append({"type": "end", "cpu": len(accs) * seconds_per_eval})
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        with gzip.open(path.with_suffix(".jsonl.gz"), "wt") as f:
            f.write(text)
    else:
        path.write_text(text)


def test_time_to_target_needs_two_consecutive_evaluations_and_censors_at_the_last(tmp_path):
    write_record(tmp_path / "uniform-seed1.jsonl", [0.70, 0.95, 0.80, 0.87, 0.90, 0.91])
    rec = summary.load(tmp_path / "uniform-seed1.jsonl")
    # (0.95 + 0.80) / 2 = 0.875 < 0.88; (0.87 + 0.90) / 2 = 0.885 at evaluation 4
    assert summary.time_to_target(rec, "cpu") == (40.0, True, 100)
    assert summary.time_to_target(rec, "clock") == (120.0, True, 100)
    assert summary.time_to_target(rec, "tokens") == (4000.0, True, 100)
    write_record(tmp_path / "uniform-seed2.jsonl", [0.70, 0.80, 0.85])
    assert summary.time_to_target(summary.load(tmp_path / "uniform-seed2.jsonl"), "cpu") == (20.0, False, 50)


def test_holm_steps_down_and_stays_monotone():
    assert summary.holm({"a": 0.004, "b": 0.03}) == {"a": 0.008, "b": 0.03}
    assert summary.holm({"a": 0.02, "b": 0.011}) == {"b": 0.022, "a": 0.022}
    assert summary.holm({"a": 0.6, "b": 0.7}) == {"a": 1.0, "b": 1.0}


def test_verdict_waits_for_every_pair_and_counts_censored_runs(tmp_path):
    slow, fast = [0.7, 0.8, 0.85, 0.88, 0.89, 0.9], [0.7, 0.86, 0.9, 0.91, 0.92, 0.92]
    for seed in (1, 2, 3):
        write_record(tmp_path / f"uniform-seed{seed}.jsonl", slow, zero=0.7)
        write_record(tmp_path / f"learnability-seed{seed}.jsonl", fast, zero=0.55, gz=seed == 3)
    write_record(tmp_path / "dapo-seed1.jsonl", [0.7, 0.75, 0.8], zero=0.0)  # never reaches 0.88: censored
    write_record(tmp_path / "dapo-seed2.jsonl", fast, finished=False)  # unfinished: left out
    text = summary.summary(tmp_path, [1, 2, 3, 4], budget=50.0)
    assert "finished runs: uniform 3, learnability 3, dapo 1" in text
    assert "| 1 | 40 | 20 | 0.500 |" in text  # uniform: (0.88 + 0.89) / 2 at 40 s; learnability (0.86 + 0.9) at 20 s
    assert "learnability / uniform: geometric-mean ratio 0.500" in text and "faster in 3 of 3" in text
    assert "dapo: fewer than 2 pairs" in text
    assert "| 1 | 40 | 20 (censored) | 0.500 |" in text
    assert "- learnability: ratio 0.500" in text and "3 of 4 pairs: **PARTIAL: not a verdict**" in text
    # secondary 4 at B/4 = 12.5 CPU s: evaluation 1 (10 s), 0.86 against 0.80 in every pair
    assert "| learnability | acc_2_5 | CPU, x 50 s | +0.060 [" in text
    complete = summary.summary(tmp_path, [1, 2, 3], budget=50.0)
    # three pairs cannot reach p < 0.01: the smallest exact sign-flip p is 1/8
    assert "3 of 3 pairs: **not shown**" in complete
    assert "| uniform | 3 | 0.700 |" in complete and "| learnability | 3 | 0.550 |" in complete
