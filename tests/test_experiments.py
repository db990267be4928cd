"""The experiment drivers behind results/ (experiments/): each starts as a module from the checkout root
(`python -m experiments.X`, no `sys.path` edits; outputs go where the arguments say), and the SST-2 summary pairs
runs."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments"


def test_every_driver_starts_as_a_module_from_the_checkout_root(tmp_path):
    """`--list` builds every job of the two queue drivers without running one; the others parse `--help`
    (the summaries would write into results/ otherwise)."""
    commands = {
        "regime_search.py": ["--list", "--out", str(tmp_path / "regime")],
        "reproduce_tmr_cpu.py": ["--list", "--out", str(tmp_path / "reproduce"), "--arms", "electra", "tmr-fifo-uniform",
                                 "delay-15", "delay-31", "--marks", "5000"],
        "regime_search_summary.py": ["--help"],
        "reproduce_tmr_summary.py": ["--help"],
        "prioritized_glue_summary.py": ["--help"],
        "heldout_auc.py": ["--help"],
        "probe_discriminator_summary.py": [str(tmp_path / "no-runs")],  # a folder without runs: empty tables
        "noisy_sst2.py": ["--help"],
        "noisy_sst2_summary.py": ["--help"],
        "noisy_sst2_irreducible.py": ["--help"],
        "minatar_dqn.py": ["--help"],
        "minatar_driver.py": ["--list", "--runs", str(tmp_path / "minatar")],
        "minatar_summary.py": ["--help"],
        "sb3_minatar.py": ["--help"],
        "dqn_cartpole.py": ["--help"],
        "prioritized_digits.py": ["--help"],
        "dqn_cartpole_ray.py": ["--help"],
        "mixing_lm.py": ["--help"],
        "mixing_lm_data.py": ["--help"],
        "mixing_lm_summary.py": ["--help"],
        "selection_sst2.py": ["--help"],
        "selection_summary.py": ["--help"],
        "selection_il_check.py": ["--help"],
        "sb3_seconds_summary.py": ["--help"],
        "sb3_cartpole_per.py": ["--help"],
        "grpo_task.py": ["--help"],
        "mixing_known_answer.py": ["--help"],
        "mixing_fair.py": ["--help"],
        "mixing_fair_summary.py": ["--help"],
        "grpo_prompts.py": ["--help"],
        "grpo_prompts_summary.py": ["--help"],
    }
    drivers = {p.name for p in EXPERIMENTS.glob("*.py")} - {"__init__.py", "probe_metrics.py", "run_queue.py",
                                                            "reproduce_tmr_data.py"}
    assert drivers == set(commands)  # a new driver gets a line here
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    running = {name: subprocess.Popen([sys.executable, "-m", f"experiments.{name[:-3]}", *argv], cwd=ROOT, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for name, argv in commands.items()}
    outputs = {}
    for name, process in running.items():
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, f"{name}: {stderr[-2000:]}"
        outputs[name] = stdout
    assert f"--output-dir {tmp_path / 'regime' / 'docs-5k'}" in outputs["regime_search.py"]  # --out is honoured
    assert f"--output-dir {tmp_path / 'reproduce' / 'pretrain' / 'reference'}" in outputs["reproduce_tmr_cpu.py"]
    for delay in (15, 31):  # measurement 3's arms: electra behind a delay line
        assert (f"delay-{delay}-seed4: --no-progress --variant electra --seed 4 " in outputs["reproduce_tmr_cpu.py"]
                and f"--delay-steps {delay} --output-dir {tmp_path / 'reproduce' / 'pretrain' / f'delay-{delay}-seed4'}"
                in outputs["reproduce_tmr_cpu.py"])
    assert "electra-seed4: fine-tuning at steps 5000 (new)\n" in outputs["reproduce_tmr_cpu.py"]  # --marks
    assert "| run |" in outputs["probe_discriminator_summary.py"]
    assert f"--run-dir {tmp_path / 'minatar' / 'breakout_per_seed4'}" in outputs["minatar_driver.py"]
    for name in ("regime_search_summary.py", "reproduce_tmr_summary.py", "prioritized_glue_summary.py",
                 "heldout_auc.py", "noisy_sst2.py", "noisy_sst2_summary.py", "noisy_sst2_irreducible.py",
                 "minatar_dqn.py", "minatar_summary.py"):
        assert outputs[name].startswith(f"usage: {name}")


def test_glue_summary_pairs_runs_by_seed(tmp_path):
    spec = importlib.util.spec_from_file_location("summary", EXPERIMENTS / "prioritized_glue_summary.py")
    summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summary)
    base = {"train_examples": 8, "train_examples_total": 80, "subset_seed": 0, "eval_examples": 4, "max_length": 16,
            "batch_size": 4, "learning_rate": 1e-3, "train_seconds": 1.0, "train_steps": 2}
    for sampling, accuracies in (("uniform", [0.5, 0.7]), ("prioritized", [0.75, 0.5])):
        runs = tmp_path / f"{sampling}_e1"
        runs.mkdir()
        rows = [{**base, "sampling": sampling, "seed": seed, "accuracy": a} for seed, a in enumerate(accuracies)]
        (runs / "results_runs.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    text = summary.render(summary.load_rows([tmp_path]), "cmd")
    assert "| uniform | 60.00 ± 14.14 |" in text and "| prioritized | 62.50 ± 17.68 |" in text
    assert "| Δ | 2.50 ± 31.82 |" in text  # paired: +25 and -20 points
    assert "| paired t-test p | 0.93 |" in text


def test_scripts_named_by_repository_paths_exist():
    """A driver that starts another script by ``REPO / "folder" / "name.py"`` names one that exists (the summary
    step of reproduce_tmr_cpu.py kept pointing at examples/ after the move, and failed without a word)."""
    import re

    named = {}
    for script in [*EXPERIMENTS.glob("*.py"), *(ROOT / "bench").glob("*.py"), *(ROOT / "checks").glob("*.py"),
                   *(ROOT / "tools").glob("*.py")]:
        for parts in re.findall(r'REPO((?:\s*/\s*"[^"]+")+)', script.read_text()):
            relative = Path(*re.findall(r'"([^"]+)"', parts))
            if relative.suffix in {".py", ".sh"}:
                named[f"{script.name}: {relative}"] = ROOT / relative
    assert named, "the pattern no longer finds the drivers' script paths"
    assert [where for where, path in named.items() if not path.exists()] == []
