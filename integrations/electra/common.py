"""The helpers pretraining and fine-tuning share, under the one name scripts written for 1.0 import them by.

Each lives in the module of its job, where the integration imports it from: `errors` (UserError and its one
report path), `flags` (options declared once, the parser every command uses), `runtime` (device, seeds,
autocast), `stats` (numbers the reports share), `output` (progress bars, quiet transformers) and `tokenizer`
(WordPiece training, loading a saved tokenizer). This module only re-exports them.
"""
from __future__ import annotations

from .errors import UserError, report_user_error
from .flags import (NONE_WORDS, OptionParser, OptionSet, ProcessOptions, add_command, apply_process_options, option,
                    options_from, typed_options)
from .output import REDIRECTED_BAR_SECONDS, progress_bar, quiet_transformers
from .runtime import AMP_DTYPES, Autocast, pick_device, set_seed
from .stats import format_mean_std, mean_std, spearman
from .tokenizer import SPECIAL_TOKENS, load_tokenizer, train_wordpiece

__all__ = ["UserError", "report_user_error", "NONE_WORDS", "OptionParser", "OptionSet", "ProcessOptions",
           "add_command", "apply_process_options", "option", "options_from", "typed_options",
           "REDIRECTED_BAR_SECONDS", "progress_bar", "quiet_transformers", "AMP_DTYPES", "Autocast", "pick_device",
           "set_seed", "format_mean_std", "mean_std", "spearman", "SPECIAL_TOKENS", "load_tokenizer",
           "train_wordpiece"]
