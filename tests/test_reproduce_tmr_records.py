"""The phase-2 reproduction's compact records: exported exactly, re-exported byte for byte, and enough for the
summary to recompute its tables and figure with paired t intervals."""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
pytest.importorskip("matplotlib")
import experiments.reproduce_tmr_summary as summary  # noqa: E402
from experiments.reproduce_tmr_data import (WINDOW, RunData, compact_pretrain, export_finished, load_runs,  # noqa: E402
                                read_jsonl_gz, restore_heldout)

STEPS = summary.STEPS


def fake_run(root: Path, name: str, seed: int, lift: float, finished: bool = True) -> Path:
    """A run directory as the pretraining loop leaves it: per-step metrics with gaps (None), held-out scorings."""
    rng = np.random.default_rng(seed)
    run = root / "pretrain" / name
    run.mkdir(parents=True)
    records = []
    for step in range(1, STEPS + 1):
        r = {"step": step, "step_seconds": float(rng.uniform(0.1, 0.3)), "produce_seconds": float(rng.uniform(0.03, 0.06)),
             "sample_age_mean": float(rng.uniform(0, 80)), "buffer_weight_mean": 1.0,
             "buffer_weight_std": float(rng.uniform(0, 0.3)),
             "replaced_auc_fresh": None if rng.random() < 0.3 else float(rng.uniform(0.4, 0.9))}
        if step % 250 == 0:
            r.update(heldout_auc=float(min(0.99, 0.5 + lift + step / 20000 + rng.normal(0, 0.01))),
                     heldout_loss=float(0.38 + rng.normal(0, 0.01)), heldout_base_entropy=0.382,
                     heldout_seconds=float(rng.uniform(1, 2)))
        records.append(r)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "config.json").write_text(json.dumps({"seed": seed}))
    if finished:
        (run / "summary.json").write_text(json.dumps({"steps": STEPS}))
        (run / "discriminator").mkdir()
        for file in ("config.json", "tokenizer_config.json", "model.safetensors", "tokenizer.json"):
            (run / "discriminator" / file).write_text(f"{name} {file}")
    return run


def test_confirmatory_main_pair_discriminators_are_kept_once(tmp_path):
    out, results = tmp_path / "runs", tmp_path / "records"
    for name in ("electra-seed7", "tmr-loss_diff-seed14", "tmr-fifo-uniform-seed7", "electra-seed3"):
        fake_run(out, name, 0, 0.0)
    fake_run(out, "electra-seed8", 0, 0.0, finished=False)
    export_finished(out, results)
    kept = results / "discriminators"
    assert sorted(p.name for p in kept.iterdir()) == ["electra-seed7", "tmr-loss_diff-seed14"]
    folder = kept / "electra-seed7"
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors.gz", "tokenizer.json.gz",
                                                         "tokenizer_config.json"]
    assert gzip.decompress((folder / "model.safetensors.gz").read_bytes()) == b"electra-seed7 model.safetensors"
    before = {p: p.read_bytes() for p in folder.iterdir()}
    (out / "pretrain" / "electra-seed7" / "discriminator" / "config.json").write_text("changed later")
    assert not any("discriminators" in str(p) for p in export_finished(out, results))  # kept as first written
    assert {p: p.read_bytes() for p in folder.iterdir()} == before


def test_compact_record_keeps_exact_window_means_scorings_and_times(tmp_path):
    run_dir = fake_run(tmp_path, "electra-seed3", 3, 0.0)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    run = RunData.from_rows(compact_pretrain(run_dir))
    assert (run.arm, run.seed) == ("electra", 3)
    for first, last in ((1, 1250), (1251, 2500), (4501, 5000), (1, WINDOW)):
        inside = [r for r in records if first <= r["step"] <= last]
        fresh = [r["replaced_auc_fresh"] for r in inside if r["replaced_auc_fresh"] is not None]
        assert run.window_mean("replaced_auc_fresh", first, last) == pytest.approx(np.mean(fresh), rel=1e-12)
        ess = [1 / (1 + r["buffer_weight_std"] ** 2) for r in inside]
        assert run.window_mean("weight_ess_fraction", first, last) == pytest.approx(np.mean(ess), rel=1e-12)
    with pytest.raises(ValueError, match="whole windows"):
        run.window_mean("sample_age_mean", 1, 1249)
    steps, auc = run.heldout_curve("heldout_auc")
    assert steps.tolist() == list(range(250, STEPS + 1, 250))
    assert auc.tolist() == [r["heldout_auc"] for r in records if "heldout_auc" in r]
    np.testing.assert_allclose(run.step_seconds, [r["step_seconds"] for r in records], atol=5e-5)
    scoring = sum(r.get("heldout_seconds", 0) for r in records)
    assert run.wall_seconds == pytest.approx(sum(r["step_seconds"] for r in records) + scoring, abs=0.01)


def test_export_writes_finished_runs_only_and_identical_bytes_again(tmp_path):
    out, results = tmp_path / "runs", tmp_path / "results"
    fake_run(out, "electra-seed0", 0, 0.0)
    fake_run(out, "electra-seed1", 1, 0.0, finished=False)
    job = out / "finetune" / "electra-seed0-at1250"
    job.mkdir(parents=True)
    (job / "results_runs.jsonl").write_text(json.dumps({"task": "sst2", "seed": 0, "accuracy": 0.55}) + "\n")
    (job / "results.md").write_text("done")
    heldout = bytes(range(256)) * 40  # stands in for the held-out safetensors file
    (out / "heldout.safetensors").write_bytes(heldout)
    (out / "heldout.json").write_text('{"examples": 390}')
    written = export_finished(out, results)
    assert sorted(p.relative_to(results).as_posix() for p in written) == [
        "finetune/electra-seed0-at1250.jsonl.gz", "heldout.json", "heldout.safetensors.gz",
        "pretrain/electra-seed0.jsonl.gz"]
    fresh = tmp_path / "fresh"  # a fresh machine: the held-out set comes from the committed copy
    assert restore_heldout(fresh, results) and (fresh / "heldout.safetensors").read_bytes() == heldout
    assert (fresh / "heldout.json").read_text() == '{"examples": 390}'
    assert not restore_heldout(tmp_path / "none", tmp_path / "no-records")
    first = (results / "pretrain" / "electra-seed0.jsonl.gz").read_bytes()
    assert export_finished(out, results) == []  # nothing stale
    (results / "pretrain" / "electra-seed0.jsonl.gz").unlink()
    export_finished(out, results)
    assert (results / "pretrain" / "electra-seed0.jsonl.gz").read_bytes() == first  # deterministic gzip
    assert read_jsonl_gz(results / "finetune" / "electra-seed0-at1250.jsonl.gz") == [
        {"accuracy": 0.55, "seed": 0, "task": "sst2"}]


def test_paired_interval_is_the_t_interval_of_the_differences():
    arm = {s: summary._Const(v) for s, v in enumerate([0.61, 0.57, 0.63, 0.60, 0.62])}
    base = {s: summary._Const(v) for s, v in enumerate([0.54, 0.52, 0.51, 0.56, 0.53])}
    result = summary.paired(arm, base, lambda c: c.value)
    diffs = np.array([0.07, 0.05, 0.12, 0.04, 0.09])
    half = stats.t.ppf(0.975, 4) * diffs.std(ddof=1) / np.sqrt(5)
    assert result.mean == pytest.approx(diffs.mean())
    assert (result.low, result.high) == pytest.approx((diffs.mean() - half, diffs.mean() + half))
    t = diffs.mean() / (diffs.std(ddof=1) / np.sqrt(5))
    assert result.p == pytest.approx(2 * stats.t.sf(t, 4))
    assert "Bonferroni ×3" in result.text(adjusted=3)


def test_summary_recomputes_tables_and_figure_from_the_records_alone(tmp_path):
    out, results = tmp_path / "runs", tmp_path / "records"
    for seed in range(3):
        fake_run(out, f"electra-seed{seed}", seed, 0.0)
        fake_run(out, f"tmr-loss_diff-seed{seed}", seed + 10, 0.08)
    fake_run(out, "tmr-fifo-uniform-seed0", 20, 0.05)
    fake_run(out, "tmr-fifo-uniform-seed1", 21, 0.05)
    export_finished(out, results)
    runs = load_runs(results)
    assert {arm: sorted(seeds) for arm, seeds in runs.items()} == {
        "electra": [0, 1, 2], "tmr-loss_diff": [0, 1, 2], "tmr-fifo-uniform": [0, 1]}
    sys.argv = ["reproduce_tmr_summary.py", str(results), "--results", str(tmp_path / "tables")]
    assert summary.main() == 0
    text = (tmp_path / "tables" / "reproduction_tables.md").read_text()
    assert "| tmr-fifo-uniform | 0, 1 | – |" in text  # which runs exist
    primary = [line for line in text.splitlines() if "tmr-loss_diff − electra |" in line][0]
    assert "(n=3, p=" in primary and "Bonferroni ×3" in primary
    assert (tmp_path / "tables" / "reproduction_curves.png").stat().st_size > 10_000
    assert (tmp_path / "tables" / "reproduction_main_pair.png").stat().st_size > 10_000


def test_main_pair_difference_band_is_the_t_band_of_the_paired_curves(tmp_path):
    out = tmp_path / "runs"
    for seed in (5, 6, 7, 8):
        fake_run(out, f"electra-seed{seed}", seed, 0.0)
        fake_run(out, f"tmr-loss_diff-seed{seed}", seed + 10, 0.02 * seed)
    fake_run(out, "electra-seed9", 9, 0.0)  # no partner: left out
    export_finished(out, tmp_path / "records")
    runs = load_runs(tmp_path / "records")
    steps, n, mean, low, high = summary.paired_difference_band(runs["tmr-loss_diff"], runs["electra"],
                                                               frozenset({5, 6, 7, 9}))
    diffs = np.array([runs["tmr-loss_diff"][s].heldout_curve("heldout_auc")[1]
                      - runs["electra"][s].heldout_curve("heldout_auc")[1] for s in (5, 6, 7)])
    half = stats.t.ppf(0.975, 2) * diffs.std(0, ddof=1) / np.sqrt(3)
    assert n == 3 and list(steps) == list(range(250, STEPS + 1, 250))
    assert mean == pytest.approx(diffs.mean(0)) and high - low == pytest.approx(2 * half)


def test_figure_draws_small_arms_per_seed_and_clips_bands_to_the_metric_range(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = tmp_path / "runs"
    for seed in range(3):
        fake_run(out, f"electra-seed{seed}", seed, 0.49 if seed else 0.0)  # one low seed: a wide band
    fake_run(out, "tmr-fifo-uniform-seed0", 20, 0.05)
    fake_run(out, "tmr-fifo-uniform-seed1", 21, 0.05)
    export_finished(out, tmp_path / "records")
    runs = load_runs(tmp_path / "records")
    fig, ax = plt.subplots()
    summary.draw_arm(ax, runs["tmr-fifo-uniform"], "heldout_auc", None, "C0", "fifo", limits=(0.0, 1.0))
    assert [line.get_label() for line in ax.lines] == ["fifo (seed 0)", "fifo (seed 1)"] and not ax.collections
    summary.draw_arm(ax, runs["electra"], "heldout_auc", None, "C1", "electra", limits=(0.0, 1.0))
    [band] = ax.collections
    y = np.concatenate([path.vertices[:, 1] for path in band.get_paths()])
    _, _, _, low, high = summary.band(runs["electra"], "heldout_auc")
    assert high.max() > 1.0 and y.max() <= 1.0 and y.min() >= 0.0  # the raw band leaves [0, 1]; the drawn one not
    plt.close(fig)


def test_delay_table_pairs_the_window_with_the_delay_lines_as_designed(tmp_path):
    """Measurement 3: tmr-fifo-uniform − delay-15 is the one primary comparison (unadjusted); delay-31 − delay-15
    and delay-15 − electra the two secondary ones (Bonferroni × 2); differences of the AUCs at 1,250 by seed."""
    out, results = tmp_path / "runs", tmp_path / "records"
    for seed in range(3):
        fake_run(out, f"electra-seed{seed}", seed, 0.0)
        fake_run(out, f"delay-15-seed{seed}", seed + 30, 0.02)
        fake_run(out, f"tmr-fifo-uniform-seed{seed}", seed + 20, 0.05)
    fake_run(out, "delay-31-seed1", 41, 0.03)
    export_finished(out, results)
    runs = load_runs(results)
    text = "\n".join(summary.delay_table(runs))
    rows = {line.split(" | ")[2]: line for line in text.splitlines() if line.startswith("| primary")
            or line.startswith("| secondary")}
    assert list(rows) == ["tmr-fifo-uniform − delay-15", "delay-31 − delay-15", "delay-15 − electra"]
    at = summary.PRIMARY_STEP
    diffs = [runs["tmr-fifo-uniform"][s].heldout_at("heldout_auc", at) - runs["delay-15"][s].heldout_at("heldout_auc", at)
             for s in range(3)]
    assert f"{np.mean(diffs):+.3f} [" in rows["tmr-fifo-uniform − delay-15"]
    assert "(n=3, p=" in rows["tmr-fifo-uniform − delay-15"] and "Bonferroni" not in rows["tmr-fifo-uniform − delay-15"]
    assert "Bonferroni ×2" in rows["delay-15 − electra"] and "(n=1, no CI)" in rows["delay-31 − delay-15"]
    assert "## Secondary: arm − delay-15" in text and "| tmr-fifo-uniform |" in text
    assert "not yet run" in "\n".join(summary.delay_table({"electra": runs["electra"]}))


def test_the_confirmatory_glue_average_pairs_seeds_5_to_14_only_and_needs_every_task():
    """The 12th secondary of issue 31: tmr-loss_diff − electra of the 5-task GLUE dev average at 5,000 steps over
    the confirmatory seeds; an exploratory seed (0-4) or a seed missing a task is not paired."""
    metric = {task: summary.get_task(task).main_metric for task in summary.GLUE_TASKS}

    def rows(score, tasks=summary.GLUE_TASKS):
        return [{"task": t, metric[t]: score} for t in tasks for _ in range(3)]  # three fine-tuning seeds

    finetuning = {("electra", STEPS): {0: rows(0.1), 5: rows(0.5), 6: rows(0.6), 7: rows(0.7)},
                  ("tmr-loss_diff", STEPS): {0: rows(0.9), 5: rows(0.52), 6: rows(0.64),
                                             7: rows(0.9, summary.GLUE_TASKS[:-1])}}
    result = summary.glue_average_difference(finetuning, "tmr-loss_diff", "electra", STEPS,
                                             summary.CONFIRMATORY_SEEDS)
    assert result.seeds == [5, 6]
    np.testing.assert_allclose(result.diffs, [2.0, 4.0])  # × 100
    assert summary.glue_average_difference({}, "tmr-loss_diff", "electra", STEPS, summary.CONFIRMATORY_SEEDS) is None


def test_the_glue_tables_of_the_two_seed_sets_keep_their_seeds_apart_and_say_what_their_differences_count_as():
    """The 5-pair GLUE table reads seeds 0-4 only and the confirmatory one seeds 5-14 only; the latter's per-task
    differences are labelled as outside the protocol's comparisons."""
    metric = {task: summary.get_task(task).main_metric for task in summary.GLUE_TASKS}

    def rows(score):
        return [{"task": t, metric[t]: score} for t in summary.GLUE_TASKS]

    finetuning = {("electra", STEPS): {0: rows(0.1), 5: rows(0.5), 6: rows(0.6)},
                  ("tmr-loss_diff", STEPS): {0: rows(0.3), 5: rows(0.6), 6: rows(0.8)}}
    confirmatory = summary.finetune_tables(
        summary.glue_scores(summary.finetuning_of(finetuning, summary.CONFIRMATORY_SEEDS)), ", seeds 5-14",
        "outside the protocol")
    first = summary.finetune_tables(summary.glue_scores(summary.finetuning_of(finetuning, summary.EXPLORATORY_SEEDS)))
    assert confirmatory[1].startswith("## GLUE dev, seeds 5-14")
    assert any(line.startswith(f"| electra | {STEPS:,} | 2 | ") for line in confirmatory)
    difference = next(line for line in confirmatory if line.startswith("| tmr-loss_diff | 5,000 | +"))
    assert difference.endswith("+15.00 [-48.53, +78.53] (n=2, p=0.2) |")  # mean of 10 and 20, ± t(0.975, 1) × 5
    assert any("outside the protocol" in line for line in confirmatory)
    assert any(line.startswith(f"| electra | {STEPS:,} | 1 | ") for line in first)
    assert any("secondary, unadjusted" in line for line in first)


def test_equal_wall_time_reads_each_run_at_the_base_runs_time_to_the_step_with_scoring_counted():
    """The base reaches step 1,250 after 1,250 × 0.1 s of steps + 4 scorings of 1 s = 129 s. An arm twice as slow
    per step has by then only scored at step 500 (2 × 0.1 × 500 + 1 = 101 s; step 750 would be 152 s), so the
    difference is its AUC at 500 minus the base's at 1,250."""
    def run(name, seconds_per_step, auc_of_step):
        heldout = [{"step": s, "heldout_auc": auc_of_step(s), "heldout_seconds": 1.0} for s in range(250, STEPS + 1, 250)]
        return RunData(name, name, 5, {}, np.full(STEPS, seconds_per_step), np.zeros(STEPS), heldout)

    base = {5: run("electra", 0.1, lambda s: 0.5 + s / 10_000)}
    slow = {5: run("tmr", 0.2, lambda s: 0.6 + s / 10_000)}
    result = summary.equal_wall_difference(slow, base, summary.PRIMARY_STEP)
    np.testing.assert_allclose(result.diffs, [(0.6 + 0.05) - (0.5 + 0.125)])
    lines = summary.equal_wall_lines({"electra": base, "tmr-loss_diff": slow, "tmr-fifo-uniform": base})
    assert "electra 0.100, tmr-loss_diff 0.200, tmr-fifo-uniform 0.100 seconds" in lines[-1]
    assert "tmr-loss_diff − electra +0.025" in lines[-1]
    assert "the slowest run's steps took 2.0x as long as the fastest's" in lines[-1]


def test_fit_by_checkpoint_gives_each_seeds_mean_score_and_median_last_epoch_loss():
    metric = summary.get_task("stsb").main_metric
    finetuning = {("electra", STEPS): {5: [{"task": "stsb", metric: v, "train_loss_last_epoch": loss}
                                           for v, loss in ((0.5, 0.3), (0.6, 0.9), (0.7, 0.2))]},
                  ("tmr-loss_diff", STEPS): {6: [{"task": "stsb", metric: 0.1, "train_loss_last_epoch": 0.5},
                                                 {"task": "cola", "mcc": 0.0, "train_loss_last_epoch": 9.0}]}}
    lines = summary.fit_by_checkpoint(finetuning, "stsb", STEPS, frozenset({5, 6}))
    assert "| 5 | 60.0 / 0.30 | – |" in lines
    assert "| 6 | – | 10.0 / 0.50 |" in lines  # the other task's loss is not mixed in
    assert summary.fit_by_checkpoint({}, "stsb", STEPS, frozenset({5})) == []


def test_confirmatory_means_give_each_arms_levels_and_how_many_pairs_the_arm_led():
    def run(seed, auc_1250, first_over):
        heldout = [{"step": s, "heldout_auc": 0.5 if s < first_over else 0.65} for s in range(250, STEPS + 1, 250)]
        heldout[summary.PRIMARY_STEP // 250 - 1]["heldout_auc"] = auc_1250
        return RunData("r", "r", seed, {}, np.full(STEPS, 0.1), np.zeros(STEPS), heldout)

    fresh = {"electra": {5: run(5, 0.55, 1500), 6: run(6, 0.57, 2000)},
             "tmr-loss_diff": {5: run(5, 0.60, 1000), 6: run(6, 0.56, 1500)}}
    [line, _] = summary.confirmatory_means(fresh)
    assert "electra 0.560, 1,750; tmr-loss_diff 0.580, 1,250." in line
    assert "tmr-loss_diff − electra: 1 of 2" in line and "tmr-fifo-uniform" not in line
