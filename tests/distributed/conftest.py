"""The 2-process launches, each started once per session and read by several tests (process start-up is what
these tests cost)."""
from __future__ import annotations

import importlib.util
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

from replayloader import PrioritizedBatchSampler  # noqa: E402
from replayloader.distributed import save_shared_state  # noqa: E402
from replayloader.torch.candidates import CandidateBatchSampler  # noqa: E402

from . import scenario as sc  # noqa: E402
from . import select_scenario as ss  # noqa: E402
from .launch import accelerate_launch, launch, torchrun  # noqa: E402


@pytest.fixture(scope="session")
def one_process(tmp_path_factory) -> dict:
    """The scenario in one process; its checkpoint after `SAVE_AT` steps is resumed on 2 ranks."""
    out = tmp_path_factory.mktemp("torchrun")
    batches = PrioritizedBatchSampler(sc.make_sampler())

    def save(count: int) -> None:
        if count == sc.SAVE_AT:
            save_shared_state(batches.state_dict(), out / "one_process.npz")

    save_select_checkpoint(out / "select_one_process.npz")
    return {"out": out, "equivalence": sc.drive(sc.make_sampler(), sc.EPOCHS * sc.STEPS_PER_EPOCH),
            "uninterrupted": sc.train(batches, sc.TOTAL, on_step=save)}


def save_select_checkpoint(path) -> None:
    """The score-then-select DataLoader recipe in one process, checkpointed after `SAVE_AT` steps (resumed on 2
    ranks by the launch)."""
    candidates = CandidateBatchSampler(ss.make_sampler(), ss.make_selector("top_k"))
    sc.run_loader(ss.loader(candidates), candidates, ss.SAVE_AT, ss.loader_step)
    save_shared_state(candidates.state_dict(), path)


@pytest.fixture(scope="session")
def torchrun_reports(one_process) -> list[dict]:
    """One torchrun launch: the docs' DDP examples, the sampler's checks, score-then-select, the uninterrupted run
    of the kill test and the Hugging Face Trainer."""
    transformers = importlib.util.find_spec("transformers") is not None
    optional = ["hf_trainer", "hf_select"] if transformers else []  # else their tests skip
    return torchrun(one_process["out"], ["readme", "core", "select", "readme_select", "kill_steady", *optional])


@pytest.fixture(scope="session")
def lightning_reports(tmp_path_factory) -> list[dict]:
    """``python jobs.py OUT lightning``: Lightning's own launcher starts the second process (devices=2)."""
    pytest.importorskip("lightning")
    return launch([sys.executable], tmp_path_factory.mktemp("lightning"), ["lightning"])


@pytest.fixture(scope="session")
def accelerate_reports(tmp_path_factory) -> list[dict]:
    pytest.importorskip("accelerate")
    pytest.importorskip("transformers")
    return accelerate_launch(tmp_path_factory.mktemp("accelerate"), ["hf_trainer", "hf_select"])
