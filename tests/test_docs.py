"""The documentation: every python block of README.md and docs/ is run by a test, the site builds with
``mkdocs build --strict`` (API reference from the docstrings included), and nothing a user reads names this
workspace's own paths."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest

from tests.docs_blocks import BLOCK, EXECUTED, ROOT, blocks, pages, text


def test_every_python_block_of_the_docs_is_run_by_a_test():
    runs = {}
    for (page, after), test_file in EXECUTED.items():
        body = text(page)
        runs[(page, BLOCK.search(body, body.index(after)).start())] = (after, test_file)
        assert after in (ROOT / test_file).read_text(), f"{test_file} does not run the block after {after!r}"
    missing = [(page, code.splitlines()[0]) for page in pages() for offset, code in blocks(page)
               if (page, offset) not in runs]
    assert not missing


def test_every_page_is_in_the_site_and_the_readme_stays_a_front_door():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in pages():
        if page.startswith("docs/"):
            assert f": {page.removeprefix('docs/')}" in nav, page
    assert len((ROOT / "README.md").read_bytes()) <= 15_000


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None,
                    reason="mkdocs and mkdocstrings come with the dev extra")
def test_the_site_builds_strictly_with_the_api_reference(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, env={"NO_MKDOCS_2_WARNING": "1",
                                                                         "PATH": "", "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    api = (tmp_path / "api" / "index.html").read_text()
    for name in ("ReplayBuffer", "PrioritizedSampler", "DistributedPrioritizedSampler", "watch_launcher",
                 "InvalidState"):
        assert name in api, name


def test_nothing_a_user_reads_names_this_workspace():
    user_facing = ["README.md", *pages(), "integrations/electra/README.md",
                   *(str(p.relative_to(ROOT)) for p in (ROOT / "examples").glob("*.py"))]
    offenders = [page for page in user_facing if re.search(r"\.\./shared|/work/", (ROOT / page).read_text())]
    assert not offenders
