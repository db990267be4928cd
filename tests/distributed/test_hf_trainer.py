"""`PrioritizedTrainer` on 2 CPU processes (gloo), launched as users launch it: torchrun and accelerate launch.

The bug these tests pin (issue 23): Accelerate shards a batch sampler by handing each rank every other batch,
while each rank's sampler drew all of them, so the indices and importance weights a rank used for its loss and
its feedback belonged to another batch, and each rank's weights drifted apart.
"""
from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
torch = pytest.importorskip("torch")

from .jobs import HF_BATCH, HF_EXAMPLES  # noqa: E402


@pytest.fixture(scope="module", params=["torchrun", "accelerate"])
def hf_reports(request):
    return [r["hf_trainer"] for r in request.getfixturevalue(f"{request.param}_reports")]


def test_each_rank_feeds_back_the_batch_it_trained_on(hf_reports):
    for report in hf_reports:
        assert report["fed"] == report["seen"]
        assert len(report["seen"]) == 2 * HF_EXAMPLES // HF_BATCH  # 2 epochs of global batches
        assert all(len(batch) == HF_BATCH // 2 for batch in report["seen"])


def test_the_warmup_pass_measures_every_example_once_across_the_ranks(hf_reports):
    warmup = HF_EXAMPLES // HF_BATCH
    indices = sorted(i for report in hf_reports for batch in report["seen"][:warmup] for i in batch)
    assert indices == list(range(HF_EXAMPLES))


def test_both_ranks_hold_the_same_weights(hf_reports):
    assert hf_reports[0]["weights"] == hf_reports[1]["weights"]
    assert hf_reports[0]["visits"] == hf_reports[1]["visits"]


@pytest.fixture(scope="module", params=["torchrun", "accelerate"])
def select_reports(request):
    return [r["hf_select"] for r in request.getfixturevalue(f"{request.param}_reports")]


def test_the_selecting_trainer_scores_its_share_and_trains_half_of_the_chosen_rows(select_reports):
    """`SelectingTrainer` under torchrun and accelerate launch: each rank receives and scores its n_B / 2
    candidates, chooses n_b / 2 of them, and the ranks' sampler and selector stay identical."""
    reports = select_reports
    for report in reports:
        assert report["scored"] == report["seen"] and len(report["seen"]) == 2 * HF_EXAMPLES // HF_BATCH
        assert all(len(batch) == HF_BATCH // 2 for batch in report["seen"])
        assert all(len(rows) == HF_BATCH // 4 and set(rows) <= set(batch)
                   for rows, batch in zip(report["chosen"], report["seen"]))
    warmup = HF_EXAMPLES // HF_BATCH
    assert sorted(i for report in reports for batch in report["seen"][:warmup] for i in batch) == \
        list(range(HF_EXAMPLES))
    assert reports[0]["state"] == reports[1]["state"]
