"""The mixture on 2 gloo CPU ranks under torchrun (one launch, killed with every process it started on timeout,
and none may be left: tests/processes.py) against the same scenario in one process: identical mixtures,
bit-identical weights, checkpoints across world sizes, bad input, the docs' DDP example, the HF Trainer."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

from replayloader.distributed import load_shared_state  # noqa: E402
from replayloader.torch.mixing import MixtureBatchSampler  # noqa: E402
from tests.distributed.launch import launch, torchrun_command  # noqa: E402

from . import scenario as sc  # noqa: E402

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds a job's processes through /proc")
JOBS = Path(__file__).with_name("jobs.py")


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> tuple[Path, list[dict]]:
    out = tmp_path_factory.mktemp("mixing_ddp")
    return out, launch(torchrun_command(2), out, ["mixture", "docs", "hf"], timeout=420, script=JOBS, clean_exit=True)


@pytest.fixture(scope="module")
def one_process() -> list[dict]:
    return sc.train(MixtureBatchSampler(sc.make()), sc.TOTAL)


def test_two_ranks_draw_the_one_process_mixture_and_keep_identical_weights(launched, one_process):
    _, reports = launched
    shares = [r["mixture"]["uninterrupted"] for r in reports]
    assert [len(b["indices"]) for b in shares[0]] == [sc.BATCH // 2] * sc.TOTAL
    assert [b["mixture"] for b in shares[0]] == [b["mixture"] for b in shares[1]]  # the same mixture, each step
    assert sc.assemble(shares) == one_process  # indices, sources and mixtures, bit for bit
    assert reports[0]["mixture"]["digest"] == reports[1]["mixture"]["digest"]
    assert reports[0]["mixture"]["probabilities"] == reports[1]["mixture"]["probabilities"]
    assert len({tuple(b["mixture"]) for b in one_process}) > 3  # the feedback moved the weights


def test_a_two_rank_checkpoint_resumes_on_two_ranks_and_in_one_process(launched, one_process):
    out, reports = launched
    for report in reports:
        assert report["mixture"]["resumed"] == report["mixture"]["uninterrupted"][sc.SAVE_AT:]
    batches = MixtureBatchSampler(sc.make())
    batches.load_state_dict(load_shared_state(out / "two_ranks.npz"))
    assert sc.train(batches, sc.TOTAL - sc.SAVE_AT) == one_process[sc.SAVE_AT:]


def test_bad_feedback_on_one_rank_raises_on_both_and_changes_nothing(launched):
    _, reports = launched
    assert reports[1]["mixture"]["bad_feedback"] == ("ValueError: loss must be finite and >= 0 (training "
                                                     "losses); loss[2] = nan")
    assert "rank 1 rejected its feedback" in reports[0]["mixture"]["bad_feedback"]
    assert reports[0]["mixture"]["bad_unchanged"] and reports[1]["mixture"]["bad_unchanged"]
    for report in reports:
        assert "seed is 3 on rank 0 but 4 on rank 1" in report["mixture"]["mismatch"]


def test_the_docs_ddp_example_runs_as_written(launched):
    out, reports = launched
    docs = [r["docs"] for r in reports]
    assert docs[0] == docs[1] and docs[0]["feedback_calls"] == 2 * 19  # ceil(1200 / 64) steps a pass
    assert (out / "mixture.npz").is_file()


@pytest.mark.skipif(sys.modules.get("transformers") is None and __import__("importlib").util.find_spec(
    "transformers") is None, reason="needs transformers")
def test_the_trainer_on_two_ranks_trains_on_slices_of_one_mixture(launched):
    out, reports = launched
    hf = [r["hf"] for r in reports]
    assert hf[0]["digest"] == hf[1]["digest"] and hf[0]["feedback_calls"] == 6
    for a, b in zip(hf[0]["seen"], hf[1]["seen"]):
        assert len(a) == len(b) == 4
    assert len(hf[0]["seen"]) == 6
    assert (out / "hf" / "checkpoint-4" / "mixture_sampler.npz").is_file()
