"""Does a pretrained discriminator spot its own generator's replacements in text it never trained on? The run's
exported generator corrupts held-out lines (its tokenizer, sequence length and mask rate; a fixed seed), and the
exported discriminator scores them: ranking AUC of replaced over original tokens and L_D against the base-rate
entropy. A high training AUC with a chance-level held-out AUC means the discriminator memorised a small corpus.

    python -m experiments.heldout_auc RUN_DIR TEXT_FILE[.gz] [--skip-lines N] [--examples 256]
    python -m experiments.heldout_auc RUN_DIR python-docs --skip-lines 16600   # the frozen snapshot's last lines
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, ElectraForMaskedLM, ElectraForPreTraining

from replayloader_electra.corpus import manifest, snapshot_file  # noqa: E402
from replayloader_electra.pretrain.config import saved_run_config  # noqa: E402
from replayloader_electra.pretrain.heldout import build_heldout_set, evaluate_heldout  # noqa: E402


def heldout_lines(path: str, skip: int) -> list[str]:
    """Non-blank lines after the first ``skip`` of a text file, or of an embedded corpus's verified snapshot."""
    if path in manifest():
        path = str(snapshot_file(path)[0])
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as text:
        return [line.strip() for i, line in enumerate(text) if i >= skip and line.strip()]


def heldout_auc(run: Path, text_file: str, skip_lines: int = 0, examples: int = 256, seed: int = 0) -> dict:
    """AUC and L_D of the run's discriminator on `examples` packed held-out examples corrupted by its generator."""
    config = saved_run_config(run, flag="RUN_DIR")
    tokenizer = AutoTokenizer.from_pretrained(str(run / "discriminator"))
    discriminator = ElectraForPreTraining.from_pretrained(str(run / "discriminator"))
    generator = ElectraForMaskedLM.from_pretrained(str(run / "generator"))
    heldout = build_heldout_set(generator, tokenizer, heldout_lines(text_file, skip_lines), config.max_len,
                                examples, config.mask_prob, config.mask_token_prob, seed, batch_size=32)
    scores = evaluate_heldout(discriminator, heldout)
    return {"examples": len(heldout), "auc": scores["heldout_auc"], "discriminator_loss": scores["heldout_loss"],
            "prior_entropy": scores["heldout_base_entropy"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run")
    parser.add_argument("text_file", help="a .txt/.gz file, or an embedded corpus name (python-docs)")
    parser.add_argument("--skip-lines", type=int, default=0, help="start after this many lines of the file")
    parser.add_argument("--examples", type=int, default=256, help="packed examples to score (default 256)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(json.dumps(heldout_auc(Path(args.run), args.text_file, args.skip_lines, args.examples)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
