"""The python blocks of README.md and docs/*.md, found by page and by the text they follow.

Every block is run by a test (`EXECUTED` says which, and tests/test_docs.py checks that no block is left out),
so what a user copies from the documentation works as written.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)

# (page, the text the block is the first python block after) -> the test file that runs it
EXECUTED = {
    ("README.md", "## Quickstart"): "tests/test_readme.py",
    ("README.md", "**Stable-Baselines3**"): "tests/test_readme.py",
    ("docs/strategies.md", "Optional speed hook:"): "tests/test_readme.py",
    ("docs/loader.md", "## Stateful producers"): "tests/test_readme.py",
    ("docs/loader.md", "## Background producers"): "tests/test_readme.py",
    ("docs/state.md", "# State files"): "tests/test_readme.py",
    ("docs/sampler.md", "# A fixed dataset"): "tests/test_readme_sampler.py",
    ("docs/selection.md", "# Score, then select"): "tests/test_selection_torch.py",
    ("docs/selection.md", "## A validated irreducible-loss model"): "tests/selection/test_docs_examples.py",
    ("docs/selection.md", "## Reused pools"): "tests/selection/test_docs_examples.py",
    ("docs/selection.md", "## Stale reducible loss in the sum tree"): "tests/selection/test_docs_examples.py",
    ("docs/selection.md", "## The automatic switch"): "tests/selection/test_docs_examples.py",
    ("docs/selection.md", "**A switching Trainer:**"): "tests/selection/test_docs_examples.py",
    ("docs/selection.md", "## Where each part runs"): "tests/selection/test_hf_parts.py",
    ("docs/scoring.md", "## Background scoring"): "tests/torch_scoring/test_docs_scoring.py",
    ("docs/scoring.md", "## A proxy scorer"): "tests/torch_scoring/test_docs_scoring.py",
    ("docs/scoring.md", "**With the Hugging Face Trainer:** pass the proxy"): "tests/selection/test_hf_parts.py",
    ("docs/ray.md", "# Replay across machines"): "tests/ray/test_readme_ray.py",
    ("docs/sb3.md", "# Prioritized replay for Stable-Baselines3"): "tests/sb3/test_docs_example.py",
    ("docs/distributed.md", "**Prioritized sampling over a fixed dataset under DDP**"): "tests/distributed/jobs.py",
    ("docs/distributed.md", "**Score-then-select under DDP**"): "tests/distributed/jobs.py",
    ("docs/mixing.md", "## A plain loop"): "tests/mixing/test_docs_example.py",
    ("docs/mixing.md", "## In a DataLoader"): "tests/mixing/test_docs_example.py",
    ("docs/mixing.md", "**Streams.**"): "tests/mixing/test_docs_example.py",
    ("docs/mixing.md", "## Hugging Face Trainer"): "tests/mixing/test_docs_example.py",
    ("docs/mixing.md", "## Checkpoints"): "tests/mixing/test_docs_example.py",
    ("docs/mixing.md", "## Several GPUs (DDP)"): "tests/mixing/jobs.py",
    ("docs/prompts.md", "## A plain loop"): "tests/prompts/test_docs.py",
    ("docs/prompts.md", "## In a GRPO trainer's DataLoader"): "tests/prompts/test_docs.py",
    ("docs/prompts.md", "## Checkpoints"): "tests/prompts/test_docs.py",
    ("docs/prompts.md", "## With TRL: PrioritizedGRPOTrainer"): "tests/prompts/test_docs.py",
    ("docs/prompts.md", "### DAPO inside TRL: DynamicSamplingGRPOTrainer"): "tests/prompts/test_docs.py",
    ("docs/prompts.md", "## Baselines"): "tests/prompts/test_docs.py",
}


def pages() -> list[str]:
    return ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]


def text(page: str) -> str:
    return (ROOT / page).read_text()


def block(page: str, after: str) -> str:
    """The first python block of ``page`` after the text ``after``."""
    body = text(page)
    return BLOCK.search(body, body.index(after)).group(1)


def blocks(page: str) -> list[tuple[int, str]]:
    """Every python block of ``page``: (its offset, its code)."""
    return [(m.start(), m.group(1)) for m in BLOCK.finditer(text(page))]
