"""Issue 11, phase 1: where does ELECTRA's discriminator learn on this machine? Runs every probe of the search
(ELECTRA, tiny preset, one axis changed at a time from a Wikipedia baseline), then writes the summary table and
plot (experiments/regime_search_summary.py -> results/regime_search/regime_search.md's table, results/regime_search/regime_search.png).

    python -m experiments.regime_search                      # OUT=runs/regime_search, 2 probes at a time
    python -m experiments.regime_search --parallel 1 --only wiki-vocab1k docs-5k
    python -m experiments.regime_search --list               # the probes and their status, nothing runs

Resumable and safe to start twice: a probe whose summary.json exists is not redone, one with a checkpoint
resumes from it (every 500 steps), and a probe another driver is running (its running.pid names a live process)
is skipped. No more than --parallel probes of this folder run at once, counted over all drivers. Each probe runs
one torch thread under `nice -n 15`.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from experiments.run_queue import REPO, Job, pretrain_command, run_jobs  # noqa: E402

# ../shared/data from the main checkout, ../../shared/data from a worktree under wt/; SHARED_DATA overrides.
DATA = Path(os.environ.get("SHARED_DATA") or next(
    (p / "shared" / "data" for p in REPO.parents if (p / "shared" / "data").is_dir()), REPO.parent / "shared" / "data"))
WIKI_DIR = DATA / "wikipedia-squad"
NLTK_DIR = DATA / "nltk_data" / "corpora"
CORPORA = {  # name -> --corpus value (never the SQuAD dev articles: SQuAD dev is an evaluation set)
    "wiki": f"{WIKI_DIR}/squad-train-articles.part1of2.txt.gz,{WIKI_DIR}/squad-train-articles.part2of2.txt.gz",
    "docs": "python-docs",
    "wt2": f"{DATA}/wikitext-2/wiki.valid.tokens.gz,{DATA}/wikitext-2/wiki.test.tokens.gz",
    "brown": f"{NLTK_DIR}/brown.zip",
}
# Text no probe of that corpus trained on, for experiments/heldout_auc.py, as (file, lines to skip): raw WikiText-2
# test (other Wikipedia articles) for every corpus but WikiText-2 itself, which gets SQuAD Wikipedia paragraphs.
HELDOUT = {corpus: (str(DATA / "wikitext-2" / "wiki.test.raw.noblank.gz"), 0) for corpus in CORPORA}
HELDOUT["wt2"] = (str(WIKI_DIR / "squad-train-articles.part2of2.txt.gz"), 0)
DOCS_TRAIN_LINES = 16_600  # of python-docs' 18,479 lines (Python 3.11): the rest is in-domain held-out text


def heldout_text(out: Path, name: str) -> tuple[str, int]:
    """(file, lines to skip) of the held-out text for a probe: python-docs' last lines for the docs90 probes."""
    if name.startswith("docs90"):
        text = next((out / "cache" / "docs" / "text").glob("python-docs-py*.txt"))
        return str(text), DOCS_TRAIN_LINES + 100  # margin: --max-lines counts non-blank lines only
    return HELDOUT[PROBES[name][0]]

BASE_STEPS = 1500
CHECKPOINT_EVERY = 500

# name -> (corpus, steps, extra flags). One axis changed from the baseline (tiny preset, Wikipedia, 1,500 steps)
# unless the name says otherwise; ordered so the probes likeliest to learn and most informative run first (the
# machine is shared: 0.3-0.5 s/step on one thread when busy).
PROBES: dict[str, tuple[str, int, list[str]]] = {
    "wiki-genlayers1": ("wiki", 2000, ["--generator-layers", "1"]),  # a weaker, shallower generator
    "wiki-vocab1k": ("wiki", BASE_STEPS, ["--vocab-size", "1024"]),  # more word pieces: in-word cues
    "docs-5k": ("docs", 5000, []),  # learned slowly in 1,500 steps (results/discriminator_probe/discriminator_probe.md): to 0.8?
    "wt2-base": ("wt2", BASE_STEPS, []),  # Wikipedia text of python-docs' size (463k tokens)
    # Every axis turned the way that should favour the discriminator at once: if even this collapses, no single
    # axis will rescue the tiny model on Wikipedia.
    "wiki-favourable": ("wiki", BASE_STEPS, ["--vocab-size", "1024", "--mask-prob", "0.25", "--hidden", "128",
                                             "--generator-fraction", "0.125", "--generator-layers", "1",
                                             "--lr", "1e-3", "--warmup-steps", "300"]),
    # python-docs without its last 10% of lines, which stay held out: is what D learns there memorisation?
    "docs90-5k": ("docs", 5000, ["--max-lines", str(DOCS_TRAIN_LINES)]),
    "docs-mask0.25-3k": ("docs", 3000, ["--mask-prob", "0.25"]),  # python-docs learns: faster with more replacements?
    "wiki-mask0.25": ("wiki", BASE_STEPS, ["--mask-prob", "0.25"]),  # more replaced tokens per batch
    "wiki-hidden128": ("wiki", BASE_STEPS, ["--hidden", "128"]),
    "wiki-lr1e-3-warm500": ("wiki", BASE_STEPS, ["--lr", "1e-3", "--warmup-steps", "500"]),
    "wiki-genfrac0.125": ("wiki", BASE_STEPS, ["--generator-fraction", "0.125"]),
    "wiki-len64": ("wiki", BASE_STEPS, ["--max-len", "64"]),
    "wiki-genfrac0.5": ("wiki", BASE_STEPS, ["--generator-fraction", "0.5"]),
    "wiki-layers4": ("wiki", BASE_STEPS, ["--layers", "4"]),
    "brown-base": ("brown", BASE_STEPS, []),
    # The first 4,000 lines of the Wikipedia baseline (about python-docs' size): do repeated epochs let D learn?
    "wiki-lines4000": ("wiki", BASE_STEPS, ["--max-lines", "4000"]),
    "wiki-base-10k": ("wiki", 10_000, []),  # a late escape from the plateau?
}


def job(out: Path, name: str) -> Job:
    """A probe as a queue job: ELECTRA, tiny preset, its corpus and flags; resumed from its checkpoints."""
    corpus, steps, flags = PROBES[name]
    run = out / name
    common = ["--steps", str(steps), "--checkpoint-every", str(CHECKPOINT_EVERY), "--output-dir", str(run)]
    start = pretrain_command("--variant", "electra", "--preset", "tiny", "--corpus", CORPORA[corpus],
                             "--cache-dir", str(out / "cache" / corpus), *flags, *common)
    return Job(name, run, start, resume=pretrain_command("--resume", str(run), *common))  # the rest: from the checkpoint


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "runs" / "regime_search"))
    parser.add_argument("--parallel", type=int, default=2, help="probes of this folder running at once (default 2)")
    parser.add_argument("--only", nargs="+", default=None, help="run only these probes (default: all, in order)")
    parser.add_argument("--list", action="store_true", help="print the probes and their status, run nothing")
    parser.add_argument("--no-summary", action="store_true", help="do not write the summary at the end")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    unknown = [n for n in args.only or [] if n not in PROBES]
    if unknown:
        parser.error(f"--only: unknown probe {unknown[0]!r}; choose from {', '.join(PROBES)}")
    names = args.only or list(PROBES)
    if args.list:
        for name in names:
            probe = job(out, name)
            print(f"{probe.status():8s} {name}: {' '.join(probe.start[8:])}")
        return 0
    run_jobs([job(out, name) for name in names], out, args.parallel, wait=False)
    if not args.no_summary:
        subprocess.run([sys.executable, "-m", "experiments.regime_search_summary", str(out)], cwd=REPO, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
