"""The prioritized-sampling example scripts run end to end on a tiny budget (their figures live in results/)."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_digits_example_writes_a_table(tmp_path):
    pytest.importorskip("sklearn")
    digits = load(ROOT / "examples" / "prioritized_digits.py")
    out = tmp_path / "digits.md"
    digits.main(["--seeds", "0", "1", "--steps", "40", "--eval-every", "20", "--table-steps", "20", "40",
                 "--out", str(out)])
    text = out.read_text()
    for variant in ("uniform", "replacement", "loss", "loss_diff", "grad_bound"):
        assert f"| {variant} |" in text
    assert "| variant | step 20 | step 40 |" in text and "Command: `python examples/prioritized_digits.py" in text


def test_glue_summary_pairs_runs_by_seed(tmp_path):
    summary = load(ROOT / "examples" / "prioritized_glue_summary.py")
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
