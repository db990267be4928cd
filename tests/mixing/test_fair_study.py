"""The fair mixing study's driver resumes a run exactly from its checkpoint, and its summary computes the
protocol's quantities (on synthetic data and hand-made records: no corpus, seconds)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from experiments import mixing_fair, mixing_fair_summary  # noqa: E402
from experiments import mixing_lm_data as mdata  # noqa: E402


@pytest.fixture
def tiny_corpus(monkeypatch):
    rng = np.random.default_rng(0)
    train = [rng.integers(0, 50, (n, 16)) for n in (40, 30, 20, 25, 15, 10)]
    evals = [rng.integers(0, 50, (4, 16)) for _ in range(6)]
    meta = {"vocab_size": 50, "block": 16,
            "sources": {s: {"train_blocks": len(t), "eval_blocks": 4, "train_sha256": "x", "eval_sha256": "y"}
                        for s, t in zip(mdata.SOURCES, train)}}
    monkeypatch.setattr(mdata, "load", lambda: (meta, train, evals))
    return {**mixing_fair.DEFAULTS, "steps": 30, "eval_every": 10, "weights_every": 5, "n_embd": 16, "n_head": 2,
            "n_layer": 1}


@pytest.mark.parametrize("arm", ["odm", "stratified"])
def test_a_run_stopped_at_a_checkpoint_resumes_to_the_uninterrupted_record(tiny_corpus, tmp_path, arm):
    cfg = tiny_corpus
    whole = mixing_fair.train(arm, 3, cfg, ckpt=tmp_path / "whole.pt")
    ckpt = tmp_path / "pieces.pt"
    assert mixing_fair.train(arm, 3, cfg, ckpt=ckpt, stop_after_s=0.0) is None  # paused at step 10
    assert mixing_fair.train(arm, 3, cfg, ckpt=ckpt, stop_after_s=0.0) is None  # and at step 20
    pieces = mixing_fair.train(arm, 3, cfg, ckpt=ckpt)
    assert pieces["timing"]["chunks"] == 3 and whole["timing"]["chunks"] == 1
    assert [e["ce"] for e in pieces["evals"]] == [e["ce"] for e in whole["evals"]]
    assert pieces["weights"] == whole["weights"] and pieces["drawn_per_source"] == whole["drawn_per_source"]
    if arm == "odm":  # the authors' rule moved off its natural start after the scaled warm-up
        assert pieces["weights"][-1]["weights"] != pieces["weights"][0]["weights"]
        assert set(pieces["estimates"][-1]) == {"step", "reward", "exploration"}


def test_a_checkpoint_of_another_configuration_is_refused(tiny_corpus, tmp_path):
    ckpt = tmp_path / "c.pt"
    mixing_fair.train("odm", 3, tiny_corpus, ckpt=ckpt, stop_after_s=0.0)
    with pytest.raises(SystemExit, match="another configuration"):
        mixing_fair.train("odm", 3, {**tiny_corpus, "lr": 1e-3}, ckpt=ckpt)


def record(arm, seed, ppl_curve, cpu_curve, worst):
    evals = [{"step": 100 * i, "mean_ppl": p, "worst_ppl": worst, "train_cpu_s": c}
             for i, (p, c) in enumerate(zip(ppl_curve, cpu_curve))]
    return {"arm": arm, "seed": seed, "sources": ["a", "b"], "evals": evals,
            "final": {"mean_ppl": ppl_curve[-1], "worst_ppl": worst},
            "weights": [{"step": 0, "weights": [0.5, 0.5]}, {"step": 100, "weights": [0.4, 0.6]}],
            "timing": {"train_cpu_s": cpu_curve[-1], "mixing_frac_of_step_cpu": 0.001}}


def test_perplexity_at_equal_cpu_is_interpolated_on_the_cpu_axis():
    rec = record("odm", 0, [100.0, 60.0, 40.0], [0.0, 10.0, 30.0], 50.0)
    assert mixing_fair_summary.at_cpu(rec, 20.0) == pytest.approx(50.0)
    assert mixing_fair_summary.at_cpu(rec, 99.0) == pytest.approx(40.0)
    recs = {"odm": {s: record("odm", s, [100.0, 60.0, 40.0], [0.0, 10.0, 30.0], 50.0) for s in (0, 1)},
            "stratified": {s: record("stratified", s, [100.0, 70.0, 45.0 + s], [0.0, 10.0, 20.0], 60.0)
                           for s in (0, 1)}}
    r = mixing_fair_summary.equal_cpu(recs, "odm")  # T = 20 s: odm 50.0 against stratified 45 and 46
    np.testing.assert_allclose(r["diff"], [5.0, 4.0])
    text = mixing_fair_summary.summarize(recs)
    assert "Partial: no verdict" in text and "| stratified | 2 |" in text
