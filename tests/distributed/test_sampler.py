"""DistributedPrioritizedSampler on 2 gloo CPU processes (one torchrun launch, see conftest.py) against the same
scenario in one process: equivalence, checkpoints across world sizes, bad input, the docs' example."""
from __future__ import annotations

import numpy as np
import pytest

from replayloader import PrioritizedBatchSampler, PrioritizedSampler
from replayloader.sampler import SampledBatch
from replayloader.distributed import load_shared_state, state_digest

from . import scenario as sc


def shares(reports: list[dict], name: str) -> list[list[dict]]:
    return [report["core"][name] for report in reports]


@pytest.mark.parametrize("run", ["equivalence", "equivalence_overlap"])
def test_two_ranks_with_half_batches_draw_exactly_what_one_process_draws(torchrun_reports, one_process, run):
    two = sc.assemble(shares(torchrun_reports, run))
    one = sc.assemble([one_process["equivalence"]])
    assert two == one  # indices, probabilities and importance weights, bit for bit
    assert {b["epoch"] for b in one} == set(range(sc.EPOCHS))
    prioritized = [w for b in one if b["epoch"] >= 1 for w in b["weights"]]
    assert min(prioritized) < 1.0 and len({tuple(b["probabilities"]) for b in one[sc.STEPS_PER_EPOCH:]}) > 1


def test_each_rank_trains_its_share_and_the_warmup_remainder_is_padded(torchrun_reports):
    rank0, rank1 = shares(torchrun_reports, "equivalence")
    assert [len(b["indices"]) for b in rank0] == [len(b["indices"]) for b in rank1]
    last = sc.STEPS_PER_EPOCH - 1  # 3 indices left in the warm-up pass: 2 per rank, the first one repeated
    assert rank0[last]["positions"] == [0, 2] and rank1[last]["positions"] == [1, 0]
    warmup = [i for share in (rank0, rank1) for b in share[:last] for i in b["indices"]]
    warmup += sc.assemble([rank0[last:last + 1], rank1[last:last + 1]])[0]["indices"]
    assert sorted(warmup) == list(range(sc.N))
    later = [len(b["indices"]) for b in rank0[sc.STEPS_PER_EPOCH:]]
    assert set(later) == {sc.B // 2}


def test_through_the_batch_sampler_with_prefetch_two_ranks_equal_one_process(torchrun_reports, one_process):
    assert sc.assemble(shares(torchrun_reports, "uninterrupted")) == sc.assemble([one_process["uninterrupted"]])


def test_resume_on_the_same_world_size_continues_exactly(torchrun_reports):
    for report in torchrun_reports:
        assert report["core"]["resumed"] == report["core"]["uninterrupted"][sc.SAVE_AT:]


def test_the_checkpoint_is_one_file_and_resumes_in_one_process(torchrun_reports, one_process):
    out = one_process["out"]
    assert sorted(p.name for p in out.glob("two_ranks*")) == ["two_ranks.npz"]
    batches = PrioritizedBatchSampler(sc.make_sampler())
    batches.load_state_dict(load_shared_state(out / "two_ranks.npz"))
    resumed = sc.assemble([sc.train(batches, sc.TOTAL - sc.SAVE_AT)])
    assert resumed == sc.assemble(shares(torchrun_reports, "uninterrupted"))[sc.SAVE_AT:]


def test_a_one_process_checkpoint_resumes_on_two_ranks(torchrun_reports, one_process):
    resumed = sc.assemble(shares(torchrun_reports, "from_one_process"))
    assert resumed == sc.assemble([one_process["uninterrupted"]])[sc.SAVE_AT:]


def test_ragged_feedback_is_applied_in_one_order_on_every_rank(torchrun_reports):
    one = sc.make_sampler()  # what the ranks' merged feedback amounts to: rank 0's share of each step first,
    share = [0, 2, 4, 6]     # then rank 1's plain indices (the whole first batch), then rank 0's share alone
    for plain in (True, False):
        whole = one.next_batch()
        part = SampledBatch(whole.indices[share], whole.probabilities[share], whole.weights[share], whole.epoch,
                            whole.step)
        one.feedback(part, loss=sc.loss_of(part.indices, part.epoch))
        if plain:
            one.feedback(whole.indices, loss=sc.loss_of(whole.indices, whole.epoch))
    reports = [report["core"]["ragged"] for report in torchrun_reports]
    assert reports[0] == reports[1] and reports[0]["digest"] == state_digest(one.state_dict())
    narrow = 8 * 2 * (1 + 11 + 3 * sc.B // 2)  # two ranks' rows of header + positions, indices, values
    assert reports[0]["gathers"] == 2 and reports[0]["bytes"] > 2 * narrow  # the wider second gather ran


@pytest.mark.parametrize("case, message", [
    ("num_examples", "num_examples is 51 on rank 0 but 52 on rank 1"),
    ("seed", "seed is 0 on rank 0 but 1 on rank 1"),
    ("seed_none", "state is"),
    ("alpha", "alpha is 1.0 on rank 0 but 2.0 on rank 1"),
    ("dataset_size", "dataset_size is 51 on rank 0 but 52 on rank 1"),
    ("batch_size", "batch_size (the global batch) is 7, which is not divisible by the world size 2"),
    ("diverged", "diverged before this update (batches drawn: rank 0: 1, rank 1: 2"),
    ("save_differs", "the ranks' states differ"),
])
def test_bad_input_raises_a_clear_error_on_every_rank(torchrun_reports, case, message):
    for report in torchrun_reports:
        error = report["core"]["errors"][case]
        assert error is not None and message in error, (case, error)
    assert not torchrun_reports[0]["core"]["errors"]["save_differs_wrote"]


def test_bad_feedback_on_one_rank_is_rejected_on_both_and_changes_nothing(torchrun_reports):
    rank0, rank1 = (report["core"]["errors"] for report in torchrun_reports)
    assert "rank 1 rejected its feedback" in rank0["nan_on_rank_1"]
    assert "loss must be finite and >= 0; loss[0] = nan" in rank1["nan_on_rank_1"]
    assert rank0["unchanged_after_rejection"] and rank1["unchanged_after_rejection"]
    assert rank0["good_update_after_rejection"] is None and rank1["good_update_after_rejection"] is None
    # overlapped: rank 1 raises at its update, rank 0 at its next draw, which waits for the gather
    assert "rank 1 rejected its feedback" in rank0["overlap_nan_on_rank_1"]
    assert "loss[0] = nan" in rank1["overlap_nan_on_rank_1"]


def test_the_readme_example_keeps_both_ranks_identical_and_its_file_loads_in_one_process(torchrun_reports,
                                                                                           one_process):
    rank0, rank1 = (report["readme"] for report in torchrun_reports)
    assert rank0 == rank1 and rank0["epoch"] == 3
    sampler = PrioritizedSampler(1000, batch_size=64, beta=0.5, uniform_fraction=0.1, seed=0)
    PrioritizedBatchSampler(sampler).load_state_dict(load_shared_state(one_process["out"] / "sampler.npz"))
    assert np.array_equal(sampler.weights, rank0["weights"])
