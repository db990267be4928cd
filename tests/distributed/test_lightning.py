"""`PrioritizedModule` under Lightning's ``Trainer(strategy="ddp")`` on 2 gloo CPU processes started by Lightning's
own launcher (``python script.py``, devices=2): each rank feeds back the batch it trained on, the ranks stay
identical, and a run resumed from a Lightning checkpoint continues exactly."""
from __future__ import annotations

import pytest

pytest.importorskip("lightning")

from .jobs import LIGHTNING_BATCH, LIGHTNING_EPOCHS, LIGHTNING_EXAMPLES  # noqa: E402

STEPS = LIGHTNING_EXAMPLES // LIGHTNING_BATCH


@pytest.fixture(scope="module")
def runs(lightning_reports):
    return [report["lightning"] for report in lightning_reports]


def test_each_rank_feeds_back_its_own_share_of_every_batch(runs):
    for run in runs:
        assert [s["fed"] for s in run["full"]] == [s["seen"] for s in run["full"]]
        assert [s["epoch"] for s in run["full"]] == [e for e in range(LIGHTNING_EPOCHS) for _ in range(STEPS)]
        assert {len(s["seen"]) for s in run["full"]} == {LIGHTNING_BATCH // 2}
    warmup = sorted(i for run in runs for s in run["full"][:STEPS] for i in s["seen"])
    assert warmup == list(range(LIGHTNING_EXAMPLES))


def test_both_ranks_hold_the_same_weights(runs):
    assert runs[0]["weights"] == runs[1]["weights"]
    assert any(w < 1.0 for s in runs[0]["full"][STEPS:] for w in s["weights"])  # prioritized after the warm-up


def test_a_run_resumed_from_a_lightning_checkpoint_continues_exactly(runs):
    for run in runs:
        assert run["resumed"] == run["full"][2 * STEPS:]
        assert run["resumed_weights"] == run["weights"]
