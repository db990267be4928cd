"""Score-then-select on 2 gloo CPU processes (`DistributedScoreThenSelect`, `CandidateBatchSampler` in a
DataLoader loop; one torchrun launch, see conftest.py) against one process applying the same per-slice rule."""
from __future__ import annotations

import numpy as np
import pytest

from replayloader import PrioritizedSampler
from replayloader.distributed import load_shared_state, state_digest
from replayloader.selection import Selector, TopK
from replayloader.torch.candidates import CandidateBatchSampler

from . import scenario as sc
from . import select_scenario as ss


def ranks(reports: list[dict], name: str):
    return [report["select"][name] for report in reports]


@pytest.mark.parametrize("rule", list(ss.RULES))
def test_two_ranks_choose_exactly_what_one_process_chooses_slice_by_slice(torchrun_reports, rule):
    runs = ranks(torchrun_reports, rule)
    reference = ss.Reference(rule)
    expected = reference.drive(ss.STEPS)
    assert [run["records"] for run in runs] == expected  # candidates, chosen rows and weights, bit for bit
    assert {b["epoch"] for b in expected[0]} == {0, 1, 2, 3}
    assert runs[0]["sampler"] == runs[1]["sampler"] == state_digest(reference.sampler.state_dict())  # the tree
    assert runs[0]["verified"] == runs[1]["verified"]  # sampler + selector, checked identical across the ranks
    for run in runs:
        assert run["rng"] == reference.selector.rng_state.tolist()
        assert run["memory"] == {k: np.asarray(v).tolist() for k, v in reference.selector.rule.state_dict().items()}
        assert run["counters"]["score_gathers"] == ss.STEPS


def test_each_rank_scores_its_own_share_and_trains_the_same_number_of_rows(torchrun_reports):
    rank0, rank1 = (run["records"] for run in ranks(torchrun_reports, "top_k"))
    last = ss.STEPS_PER_EPOCH - 1  # 3 candidates left in the warm-up pass: 2 per rank, the first one repeated
    for step, (a, b) in enumerate(zip(rank0, rank1)):
        assert step == last or sorted(a["positions"] + b["positions"]) == list(range(ss.CANDIDATES))
        assert len(a["chosen"]) == len(b["chosen"]) == ss.CHOSEN // 2
    assert rank0[last]["positions"] == [0, 2] and rank1[last]["positions"] == [1, 0]
    warmup = {i for share in (rank0, rank1) for b in share[:ss.STEPS_PER_EPOCH] for i in b["candidates"]}
    assert warmup == set(range(ss.N))
    proportional = [w for b in ranks(torchrun_reports, "proportional")[0]["records"] for w in b["weights"]]
    assert min(proportional) < 1.0  # the rule's and the candidates' importance weights are in


def test_the_dataloader_recipe_on_two_ranks_equals_one_process_with_the_same_prefetch(torchrun_reports):
    reference = ss.Reference("top_k")
    assert ranks(torchrun_reports, "loader") == reference.train(ss.TOTAL)
    assert ranks(torchrun_reports, "loader_sampler") == [state_digest(reference.sampler.state_dict())] * 2


def test_the_dataloader_recipe_resumes_from_one_file_on_two_ranks(torchrun_reports, one_process):
    assert sorted(p.name for p in one_process["out"].glob("select_loader*")) == ["select_loader.npz"]
    for run, resumed in zip(ranks(torchrun_reports, "loader"), ranks(torchrun_reports, "loader_resumed")):
        assert resumed == run[ss.SAVE_AT:]
    assert ranks(torchrun_reports, "loader_resumed_sampler") == ranks(torchrun_reports, "loader_sampler")


def test_the_two_rank_file_resumes_in_one_process(torchrun_reports, one_process):
    """Sampler, prefetched candidate batches and selector carry over; from then on one slice (the whole batch)."""
    batches = CandidateBatchSampler(ss.make_sampler(), ss.make_selector("top_k"))
    batches.load_state_dict(load_shared_state(one_process["out"] / "select_loader.npz"))
    resumed = sc.run_loader(ss.loader(batches), batches, ss.TOTAL - ss.SAVE_AT, ss.loader_step)
    reference = ss.Reference("top_k", world_at=lambda count: 2 if count < ss.SAVE_AT else 1)
    assert resumed == reference.train(ss.TOTAL)[0][ss.SAVE_AT:]
    assert state_digest(batches.sampler.state_dict()) == state_digest(reference.sampler.state_dict())


def test_a_one_process_file_resumes_on_two_ranks(torchrun_reports):
    """The ranks continue a one-process run's candidates and selector, each choosing within its slice."""
    reference = ss.Reference("top_k", world_at=lambda count: 1 if count < ss.SAVE_AT else 2)
    rank0, rank1 = reference.train(ss.TOTAL)  # rank 1's slices exist from SAVE_AT on
    assert len(rank1) == ss.TOTAL - ss.SAVE_AT
    assert ranks(torchrun_reports, "loader_from_one_process") == [rank0[ss.SAVE_AT:], rank1]


def test_a_chooser_resumes_from_one_file_and_refuses_another_rules_state(torchrun_reports):
    for run in ranks(torchrun_reports, "resumed"):
        assert run["resumed"] == run["continued"]  # candidates, chosen rows, weights: SelectiveBackprop's history
        assert "checkpoint has rule" in run["wrong_rule"] and run["wrong_rule_unchanged"]


@pytest.mark.parametrize("case, message", [
    ("k_not_divisible", "k (n_b) = 3 is not divisible by the world size 2"),
    ("k_too_large", "k (n_b) = 10 exceeds the candidate batch size (n_B) = 8"),
    ("seed", "the Selector differs across ranks"),
    ("not_distributed", "sampler must be a DistributedPrioritizedSampler, got PrioritizedSampler"),
    ("nan_on_rank_0", "slice 0 of 2 (rank 0): losses must be finite; losses[1] = nan"),
    ("plain_batch", "candidates must be the RankBatch this rank's sampler drew, got SampledBatch"),
    ("diverged", "diverged before this update (batches drawn: rank 0: 1, rank 1: 2"),
])
def test_bad_input_raises_a_clear_error_on_every_rank(torchrun_reports, case, message):
    for errors in ranks(torchrun_reports, "errors"):
        assert errors[case] is not None and message in errors[case], (case, errors[case])


def test_losses_of_the_wrong_shape_on_one_rank_are_refused_on_both_and_change_nothing(torchrun_reports):
    rank0, rank1 = ranks(torchrun_reports, "errors")
    assert "rank 1 rejected its losses" in rank0["shape_on_rank_1"]
    assert "losses must have shape (4,), one number per candidate of this rank's share" in rank1["shape_on_rank_1"]
    for errors in (rank0, rank1):
        assert errors["shape_on_rank_1_unchanged"] and errors["nan_on_rank_0_unchanged"]
        assert errors["good_after_rejection"] is None


def test_the_readme_example_keeps_both_ranks_identical_and_its_file_loads_in_one_process(torchrun_reports,
                                                                                           one_process):
    rank0, rank1 = (report["readme_select"] for report in torchrun_reports)
    assert rank0 == rank1 and rank0["epoch"] == 3  # weights, DDP parameters and selector counters
    steps = 3 * -(-1000 // 320)
    assert rank0["stats"]["batches"] == steps and rank0["stats"]["selected"] == steps * 32
    sampler = PrioritizedSampler(1000, batch_size=320, seed=0)
    selector = Selector(TopK(32), seed=0)
    CandidateBatchSampler(sampler, selector).load_state_dict(load_shared_state(one_process["out"] / "select.npz"))
    assert np.array_equal(sampler.weights, rank0["weights"]) and selector.stats() == rank0["stats"]
