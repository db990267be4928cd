"""The weight log and ``python -m replayloader.mixing.plot LOG -o PNG``."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from replayloader.mixing import ODM, MixtureSampler
from replayloader.mixing.plot import read_log

ROOT = Path(__file__).resolve().parents[2]


def write_log(path):
    sampler = MixtureSampler([10, 20, 30], batch_size=6, rule=ODM(warmup_steps=0), seed=0, names=["web", "code", "books"],
                             log_path=path, log_every=2)
    for _ in range(40):
        batch = sampler.next_batch()
        sampler.feedback(batch, loss=1.0 + batch.sources.astype(float))
    return sampler


def plot(*args):
    return subprocess.run([sys.executable, "-m", "replayloader.mixing.plot", *map(str, args)], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)


def test_the_log_reads_back_as_the_weights_drawn_with(tmp_path):
    write_log(tmp_path / "w.jsonl")
    steps, weights = read_log(tmp_path / "w.jsonl")
    assert steps == list(range(0, 40, 2)) and list(weights) == ["web", "code", "books"]
    np.testing.assert_allclose(np.sum(list(weights.values()), axis=0), 1.0)
    assert weights["books"][-1] > weights["web"][-1]  # the highest loss gained weight


def test_the_plot_command_writes_an_image(tmp_path):
    pytest.importorskip("matplotlib")
    write_log(tmp_path / "w.jsonl")
    done = plot(tmp_path / "w.jsonl", "-o", tmp_path / "w.png")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "w.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_plot_command_says_what_is_wrong(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"step": 0, "weights": {"a": 1.0}}\n{"steps": 1}\n')
    done = plot(tmp_path / "bad.jsonl", "-o", tmp_path / "w.png")
    assert done.returncode == 2 and "bad.jsonl:2: not a mixture log line" in done.stderr
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from replayloader.mixing.plot import main\n"
            f"sys.exit(main([{str(tmp_path / 'bad.jsonl')!r}, '-o', 'x.png']))")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "needs matplotlib: pip install matplotlib" in done.stderr


def test_a_resumed_run_logs_its_steps_again_and_the_reader_keeps_the_last(tmp_path):
    log = tmp_path / "w.jsonl"
    first = MixtureSampler([10, 20], batch_size=4, rule=ODM(warmup_steps=0), seed=0, log_path=log)
    for _ in range(5):
        first.next_batch()
    state = first.state_dict()
    for _ in range(3):  # steps 5, 6, 7: logged, then lost with the process
        first.next_batch()
    resumed = MixtureSampler([10, 20], batch_size=4, rule=ODM(warmup_steps=0), seed=0, log_path=log)
    resumed.load_state_dict(state)
    for _ in range(5):
        batch = resumed.next_batch()
        resumed.feedback(batch, loss=5.0 * batch.sources)
    assert len(log.read_text().splitlines()) == 13
    steps, weights = read_log(log)
    assert steps == list(range(10)) and weights["1"][-1] > weights["0"][-1]
