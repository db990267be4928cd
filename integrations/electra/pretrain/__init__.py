"""ELECTRA and TMR pretraining, one module per job.

`config` (options, declared once), `corruption` (masking + replacements: the loader's producer), `losses` (the
discriminator's loss and the optimizer), `feedback` (the per-example signal each variant sends to its buffer),
`checkpoint` (exact resume), `metrics` (per-step records, curves, summary), `distributed` (torchrun: where ranks
meet) and `loop` (the run, top to bottom).
"""
from .checkpoint import find_checkpoint, load_checkpoint, save_checkpoint
from .config import FEEDBACK, REPLACEMENTS, VARIANTS, PretrainConfig, model_preset, resume_config
from .corruption import (CorruptionProducer, SpecialIds, choose_masked_positions, corrupt_batch, gumbel_max_sample,
                         mask_inputs, uniform_replacements)
from .feedback import make_feedback
from .losses import DiscriminatorLosses, discriminator_losses, make_optimizer
from .loop import PretrainResult, pretrain
from .metrics import plot_metrics, read_metrics, summarize

__all__ = ["VARIANTS", "FEEDBACK", "REPLACEMENTS", "PretrainConfig", "PretrainResult", "pretrain", "resume_config",
           "model_preset", "corrupt_batch", "CorruptionProducer", "discriminator_losses", "DiscriminatorLosses",
           "choose_masked_positions", "mask_inputs", "gumbel_max_sample", "uniform_replacements", "SpecialIds",
           "make_optimizer", "make_feedback", "save_checkpoint", "load_checkpoint", "find_checkpoint", "summarize",
           "plot_metrics", "read_metrics"]
