"""experiments/sb3_minatar.py (issue 30's return measurement): each endpoint of its protocol against hand-computed
values on synthetic records, and the driver end to end on a tiny run of both arms side by side."""
import gzip
import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("minatar")
pytest.importorskip("stable_baselines3")

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from experiments import sb3_minatar  # noqa: E402


def record(arm: str, frames, returns, cpu, *, total=1_000, train_cpu_s=None, evals=None) -> dict:
    return {"arm": arm, "frames": total, "episodes": {"frame": frames, "return": returns, "cpu_s": cpu},
            "evals": evals or [], "train_cpu_s": train_cpu_s if train_cpu_s is not None else cpu[-1],
            "wall_s": 1.0}


def test_primary_is_the_mean_of_episodes_ending_after_nine_tenths_of_the_frames():
    r = record("per", [100, 900, 901, 1_000], [1.0, 50.0, 4.0, 6.0], [1, 2, 3, 4])
    assert sb3_minatar.last_tenth_mean(r) == 5.0  # frame 900 is not after 0.9 * 1,000
    assert np.isnan(sb3_minatar.last_tenth_mean(record("per", [10], [1.0], [1])))


def test_learning_curve_area_averages_bin_means_and_skips_empty_bins():
    # 30 bins of 100 frames over 3,000; episodes end in bin 0 (frames 1-100), bin 0 again, and bin 29 (2,901-3,000)
    r = record("per", [1, 100, 3_000], [2.0, 4.0, 9.0], [1, 2, 3], total=3_000)
    assert sb3_minatar.learning_curve_area(r) == pytest.approx((3.0 + 9.0) / 2)
    r = record("per", [101], [7.0], [1], total=3_000)  # frame 101 opens bin 1
    assert sb3_minatar.learning_curve_area(r) == 7.0


def test_last_evaluation_uses_the_evaluation_at_the_final_frame_only():
    r = record("per", [1], [0.0], [1], evals=[{"frame": 500, "returns": [100.0]}, {"frame": 1_000, "returns": [1, 3]}])
    assert sb3_minatar.last_evaluation_mean(r) == 2.0
    assert np.isnan(sb3_minatar.last_evaluation_mean(record("per", [1], [0.0], [1])))


def test_equal_time_window_is_the_last_tenth_of_the_faster_runs_cpu_time():
    fast = record("uniform", [1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0], [50.0, 91.0, 99.0, 100.0], train_cpu_s=100.0)
    slow = record("per", [1, 2, 3, 4], [10.0, 20.0, 30.0, 40.0], [80.0, 95.0, 100.0, 120.0], train_cpu_s=130.0)
    assert sb3_minatar.equal_time_means(fast, slow) == (3.0, 25.0)  # T = 100: (90, 100]


def test_summary_pairs_by_seed_and_reports_a_paired_t_interval(tmp_path):
    from scipy import stats

    diffs = []
    for seed, (u, p) in enumerate([(1.0, 2.0), (2.0, 2.5), (3.0, 5.0)]):
        for arm, value in (("uniform", u), ("per", p)):
            r = record(arm, [950, 1_000], [value, value], [9.5, 10.0],
                       evals=[{"frame": 1_000, "returns": [value]}])
            with gzip.open(sb3_minatar.record_path(tmp_path, arm, seed), "wt") as handle:
                json.dump(r, handle)
        diffs.append(p - u)
    text = sb3_minatar.summary(tmp_path, [0, 1, 2, 3, 4])
    low, high = stats.ttest_1samp(diffs, 0.0).confidence_interval(0.95)
    assert "Pairs finished: 3 of 5 (PARTIAL" in text
    assert f"per - uniform: {np.mean(diffs):+.2f} [{low:+.2f}, {high:+.2f}]" in text
    assert "| 2 | 3.00 | 5.00 | +2.00 |" in text


def test_driver_runs_both_arms_side_by_side_and_skips_finished_runs(tmp_path, capsys):
    settings = ["--seeds", "0", "--frames", "1200", "--learning-starts", "400", "--eval-every", "600",
                "--eval-episodes", "1", "--results", str(tmp_path), "--nice", "0"]
    sb3_minatar.main(settings)
    for arm in sb3_minatar.ARMS:
        with gzip.open(sb3_minatar.record_path(tmp_path, arm, 0), "rt") as handle:
            r = json.load(handle)
        assert r["arm"] == arm and r["finished"] and r["frames"] == 1200
        assert [e["frame"] for e in r["evals"]] == [600, 1200]
        assert r["episodes"]["frame"] == sorted(r["episodes"]["frame"]) and r["episodes"]["frame"][-1] <= 1200
        assert len(r["episodes"]["wall_s"]) == len(r["episodes"]["frame"])
        assert r["train_wall_s"] <= r["wall_s"] + 0.05  # wall_s is rounded to 0.1 s
    capsys.readouterr()
    sb3_minatar.main(settings)
    assert capsys.readouterr().out.count("done, skipped") == 2
    assert "Pairs finished: 1 of 1" in sb3_minatar.summary(tmp_path, [0])
    report = tmp_path / "report.md"
    sb3_minatar.main(["--summary", "--seeds", "0", "--results", str(tmp_path), "--out", str(report)])
    assert "Pairs finished: 1 of 1" in report.read_text() and report.with_suffix(".png").stat().st_size > 5_000
