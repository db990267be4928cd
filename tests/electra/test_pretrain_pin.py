"""Pins a short pretraining run's per-step losses for ELECTRA and every TMR variant.

The values below were measured on the code *before* issue 14's restructure (commit 9454591, `pretrain.py` as one
module), CPU, torch 2.13.0, one torch thread, with exactly the settings of `pin_config`. They hold the restructure
to "same seeds, same losses": corruption, losses, buffer feedback and sampling must all be unchanged for these
numbers to come out again. A commit that changes a number on purpose (a library replacement) updates them in
that commit only, with a note here saying why.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from integrations.electra.pretrain import VARIANTS, PretrainConfig, pretrain, read_metrics  # noqa: E402

# variant -> (generator loss per step, discriminator loss per step), steps 1..6
PINNED: dict[str, tuple[list[float], list[float]]] = {
    "electra": (
        [1.6256946325302124, 1.3636784553527832, 1.0609865188598633, 0.8834380507469177, 0.7769765257835388, 0.7157285809516907],
        [0.6914946436882019, 0.6740504503250122, 0.6395389437675476, 0.6056402921676636, 0.5749495625495911, 0.5526826977729797]),
    "tmr-loss_diff": (
        [1.6256946325302124, 1.3636784553527832, 1.0608783960342407, 0.8830823302268982, 0.7770342826843262, 0.7150442004203796],
        [0.6914946436882019, 0.6745522618293762, 0.6408522129058838, 0.6041222810745239, 0.5824697613716125, 0.56003737449646]),
    "tmr-grad_norm": (
        [1.6256946325302124, 1.3636784553527832, 1.0608783960342407, 0.88353031873703, 0.7770384550094604, 0.715761661529541],
        [0.6914946436882019, 0.6745522618293762, 0.6398637294769287, 0.6056121587753296, 0.5742756724357605, 0.5566033720970154]),
    "tmr-grad_bound": (
        [1.6256946325302124, 1.3636784553527832, 1.0608783960342407, 0.88353031873703, 0.776944637298584, 0.7157368063926697],
        [0.6914946436882019, 0.6745522618293762, 0.6398637294769287, 0.6055329442024231, 0.574386715888977, 0.5624114274978638]),
    "tmr-lsr": (
        [1.6256946325302124, 1.3636784553527832, 1.0614107847213745, 0.88304603099823, 0.7758004069328308, 0.7140138745307922],
        [0.6914946436882019, 0.673905074596405, 0.6405311226844788, 0.6075165271759033, 0.579124927520752, 0.5598396062850952]),
    "tmr-linucb": (
        [1.6256946325302124, 1.3635574579238892, 1.0605766773223877, 0.8818190693855286, 0.7740278840065002, 0.711975634098053],
        [0.6916064620018005, 0.6745514869689941, 0.6416656374931335, 0.608315646648407, 0.5793092846870422, 0.5611127614974976]),
    "tmr-loss": (
        [1.6256946325302124, 1.3636784553527832, 1.0608783960342407, 0.88353031873703, 0.776944637298584, 0.7157368063926697],
        [0.6914946436882019, 0.6745522618293762, 0.6398637294769287, 0.6055329442024231, 0.574386715888977, 0.5624114274978638]),
}


WORDS = ("the", "a", "cat", "dog", "sat", "on", "mat", "ran", "to", "house", "big", "small", "red", "blue",
         "quickly", "slowly", "and", "but", "then", "saw", "bird", "tree", "under", "over", "green", "old")


@pytest.fixture(scope="module")
def fixed_tokenizer(tmp_path_factory) -> str:
    """A WordPiece tokenizer with a fixed vocabulary. A trained one would not do: the WordPiece trainer breaks
    count ties at the vocabulary cut-off in hash-map order, so its token set differs from process to process."""
    from transformers import BertTokenizerFast

    root = tmp_path_factory.mktemp("tokenizer")
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *WORDS, *letters, *(f"##{c}" for c in letters)]
    (root / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(vocab_file=str(root / "vocab.txt")).save_pretrained(str(root / "saved"))
    return str(root / "saved")


def pin_config(corpus: dict, tokenizer: str, out, variant: str) -> PretrainConfig:
    return PretrainConfig(variant=variant, preset="tiny", corpus=corpus["file"], tokenizer=tokenizer, max_len=32,
                          batch_size=8, steps=6, buffer_size=32, warmup_steps=2, output_dir=str(out),
                          cache_dir=corpus["cache"], progress=False, export_hf=False)


def test_every_variant_is_pinned():
    assert set(PINNED) == set(VARIANTS)


@pytest.mark.parametrize("variant", list(PINNED))
def test_short_run_losses_match_the_pinned_values(corpus, fixed_tokenizer, tmp_path, one_torch_thread, variant):
    records = read_metrics(pretrain(pin_config(corpus, fixed_tokenizer, tmp_path, variant)).metrics_path)
    generator, discriminator = PINNED[variant]
    assert [r["generator_loss"] for r in records] == pytest.approx(generator, rel=1e-6, abs=0)
    assert [r["discriminator_loss"] for r in records] == pytest.approx(discriminator, rel=1e-6, abs=0)
