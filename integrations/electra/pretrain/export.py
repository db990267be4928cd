"""Hugging Face directories from any pretraining checkpoint, so fine-tuning can start from 25%, 50%, ... of a
run (a run exports only its final models by itself)."""
from __future__ import annotations

from pathlib import Path

from ..data import prepare_pretraining_data
from ..models import build_electra_pair
from .checkpoint import export_pair, find_checkpoint, load_model_weights
from .config import model_preset, resume_config
from .corruption import SpecialIds


def export_checkpoint(path: str | Path, output_dir: str | Path) -> str:
    """Write ``output_dir/discriminator`` and ``output_dir/generator`` from a checkpoint (a step directory, or a
    run directory: its latest) and return the discriminator's directory. The tokenizer comes from the run's
    cache, rebuilt exactly as the run built it when the cache is gone."""
    checkpoint = find_checkpoint(path)
    cfg = resume_config(str(checkpoint)).filled()
    data = prepare_pretraining_data(cfg.corpus, cfg.cache_dir, cfg.vocab_size, cfg.max_len, cfg.corpus_config,
                                    cfg.tokenizer, cfg.max_lines)
    special = SpecialIds.from_tokenizer(data.tokenizer)
    pair = build_electra_pair(model_preset(cfg), len(data.tokenizer), special.pad, cfg.dropout, seed=cfg.seed)
    load_model_weights(checkpoint, pair)
    return export_pair(pair, data.tokenizer, Path(output_dir))
