"""The python blocks of docs/scoring.md run as written: background scoring in a plain loop, a proxy scorer in a
plain loop, and the Hugging Face recipe (a `SelectingTrainer` scored by a proxy) on a one-layer BERT."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from replayloader import PrioritizedSampler
from replayloader.selection import Selector, TopK
from tests.docs_blocks import block
from tests.torch_scoring.common import new_threads_after, running_threads
from tests.test_torch_sampler import TokenDataset

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run_block(after: str, name: str) -> dict:
    namespace: dict = {}
    exec(compile(block("docs/scoring.md", after), name, "exec"), namespace)
    return namespace


def test_the_background_scoring_example_runs_and_leaves_no_thread(capsys):
    before = running_threads()
    run_block("## Background scoring", "docs background scoring example")
    pools, refreshes, staleness_max, age_max = map(int, capsys.readouterr().out.split())
    assert (pools, refreshes, staleness_max, age_max) == (9, 4, 1, 2)  # r = 2: up to 1 step, used 1 step later
    assert not new_threads_after(before)


def test_the_proxy_example_runs(capsys):
    run_block("## A proxy scorer", "docs proxy example")
    steps, forward_rows, correlation = capsys.readouterr().out.split()
    assert int(steps) == 10 and int(forward_rows) == 10 * (64 + 8) and -1.0 <= float(correlation) <= 1.0
