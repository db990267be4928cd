"""Score-then-select in torch: DataLoader workers fetch candidates, the loop trains on exactly the chosen rows,
a resumed run continues the same candidate and selection stream, and the Trainer recipe runs selection steps."""

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from replayloader import PrioritizedSampler
from replayloader.selection import Proportional, ReducibleLoss, SelectiveBackprop, Selector, TopK
from replayloader.torch.candidates import CandidateBatchSampler, take_rows
from tests.test_torch_sampler import IndexDataset, TokenDataset

N, N_BIG = 40, 8  # IndexDataset has 40 examples


def make_batches(rule, seed=0, alpha=1.0):
    sampler = PrioritizedSampler(N, N_BIG, alpha=alpha, beta=0.5, uniform_fraction=0.1, seed=seed)
    irreducible = np.linspace(0.0, 0.5, N)
    return CandidateBatchSampler(sampler, Selector(rule, ReducibleLoss(irreducible), seed=seed))


def loader_for(batches, workers):
    return DataLoader(IndexDataset(), batch_sampler=batches, num_workers=workers,
                      **({"prefetch_factor": 2, "persistent_workers": False} if workers else {}))


def select_steps(batches, loader, epochs, stop_after=None, done=0):
    """Score each fetched candidate batch (a loss that depends on the index and the step), choose, and check the
    rows taken from the fetched batch are exactly the chosen examples. Returns (candidates, chosen) per step."""
    stream = []
    for _ in range(epochs):
        for batch in loader:
            candidates = batches.next_batch_info()
            assert batch["index"].tolist() == candidates.indices.tolist()  # the workers fetched the candidates
            losses = (batch["index"] % 5).float() / 4 + 0.01 * (done + len(stream))
            selection = batches.choose(candidates, losses)
            rows = take_rows(batch, selection.positions)
            assert rows["index"].tolist() == selection.indices.tolist()  # exactly the chosen examples
            assert rows["x"][:, 0].tolist() == selection.indices.astype(float).tolist()
            stream.append((candidates.indices.tolist(), selection.indices.tolist()))
            if stop_after is not None and len(stream) == stop_after:
                return stream
    return stream


@pytest.mark.parametrize("rule", [TopK(3), Proportional(3, alpha=1.0), SelectiveBackprop(selectivity=1.0, history=16)])
def test_a_two_worker_dataloader_yields_exactly_the_chosen_examples_and_matches_no_workers(rule):
    # uniform candidates (alpha 0): with workers, prioritized candidates are drawn ahead with older weights
    streams = {}
    for workers in (0, 2):
        batches = make_batches(rule, alpha=0.0)
        streams[workers] = select_steps(batches, loader_for(batches, workers), epochs=2)
    assert len(streams[0]) == 2 * 5 and streams[0] == streams[2]


@pytest.mark.parametrize("stop", [3, 7])  # mid warm-up epoch, mid prioritized epoch
def test_resume_mid_epoch_through_two_workers_continues_the_candidate_and_selection_stream(stop):
    rule = lambda: SelectiveBackprop(selectivity=2.0, history=12)  # noqa: E731 - randomized and with memory
    whole_batches = make_batches(rule())
    whole = select_steps(whole_batches, loader_for(whole_batches, 2), epochs=3)
    first = make_batches(rule())
    head = select_steps(first, loader_for(first, 2), epochs=3, stop_after=stop)
    state = first.state_dict()
    resumed = make_batches(rule(), seed=9)  # another seed: the state decides
    resumed.load_state_dict(state)
    tail = select_steps(resumed, loader_for(resumed, 2), epochs=3 - stop // 5, done=stop)
    assert head + tail[: len(whole) - stop] == whole


def test_take_rows_cuts_nested_batches_and_passes_other_values_through():
    batch = {"a": torch.arange(6).view(3, 2), "b": (torch.arange(3), [torch.ones(3)]), "name": "x"}
    rows = take_rows(batch, np.array([2, 0, 2]))
    assert rows["a"].tolist() == [[4, 5], [0, 1], [4, 5]] and rows["b"][0].tolist() == [2, 0, 2]
    assert rows["b"][1][0].tolist() == [1.0, 1.0, 1.0] and rows["name"] == "x"


def tiny_selecting_trainer(tmp_path, sampler, selector, steps):
    """A one-layer BERT classifier on the token toy task, trained by `SelectingTrainer` for ``steps`` steps."""
    transformers = pytest.importorskip("transformers")
    from replayloader.torch.hf import SelectingTrainer

    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=20, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16, num_labels=2))
    args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=steps, learning_rate=1e-3,
                                          save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True)
    dataset = TokenDataset()
    return SelectingTrainer(model=model, args=args, train_dataset=dataset, eval_dataset=dataset, sampler=sampler,
                            selector=selector)


def test_selecting_trainer_scores_candidates_and_trains_on_the_chosen_rows(tmp_path):
    n = len(TokenDataset())
    sampler = PrioritizedSampler(n, 8, alpha=0.0, seed=0)  # uniform candidates of 8
    selector = Selector(TopK(2), ReducibleLoss(np.zeros(n)), seed=0)
    trainer = tiny_selecting_trainer(tmp_path, sampler, selector, steps=6)
    model = trainer.model
    before = [p.detach().clone() for p in model.parameters()]
    result = trainer.train()
    assert np.isfinite(result.training_loss)
    assert selector.stats()["batches"] == 6 and selector.stats()["scored"] == 6 * 8
    assert selector.stats()["selected"] == 6 * 2
    assert sampler.stats()["updated"] > 0  # the scores refreshed the candidates' weights
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    selection = trainer.last_selection
    assert len(selection) == 2 and selection.scores.shape == (8,)
    assert selection.positions.tolist() == np.argsort(-selection.scores, kind="stable")[:2].tolist()
    assert np.isfinite(trainer.evaluate()["eval_loss"]) and selector.stats()["batches"] == 6  # eval: untouched


def test_readme_score_then_select_example_runs(capsys):
    from tests.docs_blocks import block

    exec(compile(block("docs/selection.md", "# Score, then select"), "docs score-then-select example", "exec"), {})
    scored, selected = capsys.readouterr().out.split()
    assert int(scored) == 1000 and int(selected) == 4 * 32  # one shuffled pass of n_B = 320: 4 candidate batches


def test_noisy_sst2_driver_runs_every_arm_resumes_and_its_summary_reads_the_records(tmp_path, capsys):
    """A smoke run of experiments/noisy_sst2.py on a 40-sentence stand-in for SST-2 (100 steps per arm)."""
    import gzip
    import json
    from experiments import noisy_sst2, noisy_sst2_summary

    words = ["good", "bad", "fine", "awful", "great", "dull", "film", "plot"]
    glue = tmp_path / "glue" / "SST-2"
    glue.mkdir(parents=True)
    for name, n in (("train.tsv", 40), ("dev.tsv", 10)):
        lines = [f"{words[i % 8]} {words[(3 * i) % 8]} film\t{i % 2}" for i in range(n)]
        (glue / name).write_text("sentence\tlabel\n" + "\n".join(lines) + "\n")
    runs = tmp_path / "runs"
    argv = ["--runs", str(runs), "--glue-dir", str(tmp_path / "glue"), "--noise", "0.2", "--seeds", "0",
            "--steps", "100"]
    noisy_sst2.main(argv)
    assert sorted(p.name for p in runs.glob("*.jsonl")) == sorted(f"{a}_noise20_seed0.jsonl" for a in noisy_sst2.ARMS)
    noisy_sst2.main(argv)  # started again: every run is skipped
    assert capsys.readouterr().out.count("done before") == len(noisy_sst2.ARMS)
    noisy_sst2.main(["--runs", str(runs), "--collect", str(tmp_path / "all.jsonl.gz")])
    records = [json.loads(line) for line in gzip.open(tmp_path / "all.jsonl.gz", "rt") if line.strip()]
    assert len(records) == 2 * len(noisy_sst2.ARMS) and all(r["trained_rows"] > 0 for r in records)
    assert (runs / "irreducible_noise20_seed0.npz").exists()
    text = noisy_sst2_summary.render(noisy_sst2_summary.load_runs(tmp_path / "all.jsonl.gz"), tmp_path)
    assert "## Primary endpoint" in text and "| rho | 1 |" in text
