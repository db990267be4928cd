"""experiments/sb3_seconds_summary.py (issue 42): time to target with censoring, the log-ratio tests and the
summary on hand-made records; no training."""
import gzip
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from experiments import sb3_minatar, sb3_seconds_summary as seconds  # noqa: E402


def record(arm, returns, cpu, wall=None, *, train_cpu_s=None, train_wall_s=None, total=1_000):
    frames = [int(total * (i + 1) / len(returns)) for i in range(len(returns))]
    episodes = {"frame": frames, "return": returns, "cpu_s": cpu}
    r = {"arm": arm, "frames": total, "episodes": episodes, "evals": [],
         "train_cpu_s": train_cpu_s if train_cpu_s is not None else cpu[-1], "wall_s": 1.0}
    if wall is not None:
        episodes["wall_s"] = wall
        r["train_wall_s"] = train_wall_s if train_wall_s is not None else wall[-1]
    return r


def test_time_to_target_is_the_end_of_the_first_window_whose_mean_reaches_it():
    r = record("per", [0.0, 3.0, 3.0, 4.0, 9.0], [1.0, 2.0, 3.0, 4.0, 5.0], [10.0, 20.0, 30.0, 40.0, 50.0])
    # windows of 3: means 2, 3.33, 5.33 -> the first >= 3 ends at episode 4 (index 3); >= 2 at episode 3
    assert seconds.time_to_target(r, 3.0, window=3) == (4.0, True)
    assert seconds.time_to_target(r, 2.0, window=3) == (3.0, True)
    assert seconds.time_to_target(r, 3.0, window=3, clock="wall") == (40.0, True)
    assert seconds.time_to_target(r, 16 / 3, window=3) == (5.0, True)  # a mean equal to the target reaches it


def test_a_run_that_never_reaches_the_target_enters_at_its_total_training_seconds():
    r = record("uniform", [1.0, 1.0, 2.0], [1.0, 2.0, 3.0], [5.0, 6.0, 7.0], train_cpu_s=3.5, train_wall_s=9.0)
    assert seconds.time_to_target(r, 10.0, window=2) == (3.5, False)
    assert seconds.time_to_target(r, 10.0, window=2, clock="wall") == (9.0, False)
    assert seconds.time_to_target(r, 1.0, window=5) == (3.5, False)  # fewer episodes than the window
    old = record("uniform", [1.0, 1.0], [1.0, 2.0])  # a record from before issue 42: no wall seconds per episode
    assert math.isnan(seconds.time_to_target(old, 1.0, window=1, clock="wall")[0])


def test_sign_flip_p_counts_every_sign_assignment():
    assert seconds.sign_flip_p([-1.0, -2.0, -3.0]) == 1 / 8  # only the observed signs reach a mean of -2
    assert seconds.sign_flip_p([-1.0, -2.0, 3.0]) == 5 / 8  # sums -6, -4, -2, 0 (x2), 2, 4, 6 vs observed 0
    assert seconds.sign_flip_p([-1.0, -2.0, -3.0], alternative="greater") == 1.0
    from scipy import stats

    d = np.random.default_rng(3).normal(-0.1, 0.2, size=7)
    exact = stats.permutation_test((d,), np.mean, permutation_type="samples", alternative="less",
                                   n_resamples=np.inf).pvalue
    assert seconds.sign_flip_p(d) == pytest.approx(exact)


def test_ratio_test_is_a_paired_t_on_log_ratios():
    from scipy import stats

    uniform, per = [100.0, 200.0, 400.0, 300.0], [80.0, 150.0, 420.0, 210.0]
    test = seconds.ratio_test(uniform, per)
    d = np.log(per) - np.log(uniform)
    assert test["ratio"] == pytest.approx(math.exp(d.mean()))
    assert test["p_t"] == pytest.approx(stats.ttest_1samp(d, 0.0, alternative="less").pvalue)
    assert test["p_flip"] == pytest.approx(seconds.sign_flip_p(d))
    assert test["ahead"] == 3
    low, high = stats.ttest_1samp(d, 0.0).confidence_interval(0.95)
    assert (test["low"], test["high"]) == pytest.approx((math.exp(low), math.exp(high)))


def test_t_power_matches_a_simulation():
    rng = np.random.default_rng(0)
    from scipy import stats

    d = rng.normal(math.log(0.9), 0.15, size=(15, 4_000))
    simulated = (stats.ttest_1samp(d, 0.0, axis=0, alternative="less").pvalue < 0.01).mean()
    assert seconds.t_power(15, 0.15, 0.9) == pytest.approx(simulated, abs=0.03)
    flip, both = seconds.simulated_power(6, 0.15, 0.9, sims=500)
    assert flip == 0.0 and both == 0.0  # with 6 pairs the smallest exact p is 1/64 > 0.01


def test_summary_pairs_seeds_and_marks_censored_runs(tmp_path):
    window_returns = {  # (uniform, per): constant returns, so the 100-episode mean is that return
        100: ([10.0] * 50 + [15.0] * 150, [15.0] * 200),
        101: ([15.0] * 200, [10.0] * 50 + [15.0] * 150),
        102: ([10.0] * 200, [15.0] * 200),  # uniform never reaches 14: censored at its total
    }
    expected = {}
    for seed, (u, p) in window_returns.items():
        for arm, returns in (("uniform", u), ("per", p)):
            cpu = [float(i + 1) for i in range(len(returns))]
            r = record(arm, returns, cpu, [2 * c for c in cpu], train_cpu_s=250.0, train_wall_s=500.0)
            with gzip.open(sb3_minatar.record_path(tmp_path, arm, seed), "wt") as handle:
                json.dump(r, handle)
            expected[seed, arm] = seconds.time_to_target(r)
    assert expected[100, "uniform"] == (130.0, True) and expected[100, "per"] == (100.0, True)
    assert expected[102, "uniform"] == (250.0, False)
    text = seconds.summary(tmp_path, [100, 101, 102, 103])
    assert "Pairs finished: 3 of 4 (PARTIAL" in text
    assert "| 102 | 250 (censored) | 100 | 0.400 |" in text
    assert "| 102 | 500 (censored) | 200 | 0.400 |" in text  # wall seconds: twice the CPU seconds here
    test = seconds.ratio_test([130.0, 100.0, 250.0], [100.0, 130.0, 100.0])
    assert f"per / uniform: {seconds.ratio_line(test)}" in text
    assert test["p_flip"] == pytest.approx(sum(
        np.dot(s, test["log_ratios"]) <= sum(test["log_ratios"]) + 1e-9
        for s in itertools.product((1, -1), repeat=3)) / 8)


def test_seed_ranges_parse_on_the_driver():
    assert sb3_minatar.parse_seeds("100-103") == [100, 101, 102, 103]
    assert sb3_minatar.parse_seeds("7") == [7]
    with pytest.raises(Exception):
        sb3_minatar.parse_seeds("5-3")
