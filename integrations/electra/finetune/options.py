"""Every fine-tuning option, declared once as dataclass fields (type, default, help).

The ``finetune`` command's parser, the ``compare`` command's ``--finetune-*`` flags and the Python API's
keyword defaults are all built from these classes (`replayloader_electra.flags.OptionParser`, on
`transformers.HfArgumentParser`). """

from __future__ import annotations

import os

from dataclasses import dataclass, fields
from pathlib import Path

from ..flags import option
from .sources import check_glue_dir
from .tasks import GLUE_TASKS

REPO_ROOT = Path(__file__).resolve().parents[3]
TASK_CHOICES = (*GLUE_TASKS, "glue", "squad")
DEFAULT_SEEDS = (0, 1, 2)
DEFAULT_OUTPUT_DIR = "runs/finetune"
# ELECTRA's fine-tuning table (learning rate, layer-wise decay) by model size; chosen by hidden size by default.
FINETUNE_PRESETS: dict[str, tuple[float, float]] = {"small": (3e-4, 0.8), "base": (1e-4, 0.8), "large": (5e-5, 0.9)}
SAMPLINGS = ("uniform", "prioritized")
DATA, SUBSET, TRAINING, WINDOWS, RUN = "data", "subsets and seeds", "training (ELECTRA's recipe)", "inputs", "run"


DATA_ENV = "REPLAYLOADER_DATA"  # a directory holding glue/ and squad/ in their official layouts


def default_data_dir(name: str) -> str | None:
    """``$REPLAYLOADER_DATA/<name>`` when that variable names a directory holding it, else None (= the hub or,
    for compare, no fine-tuning). One variable instead of a path per task, so that a machine with local copies
    (a cluster's shared disk, an offline box) says where they are once."""
    root = os.environ.get(DATA_ENV)
    candidate = Path(root, name) if root else None
    return str(candidate.resolve()) if candidate is not None and candidate.is_dir() else None


@dataclass
class DataOptions:
    """Where the task data comes from."""

    glue_dir: str | None = option(
        default_data_dir("glue"), "GLUE directory in the official glue_data layout (task folders SST-2/, CoLA/, "
        "...), or 'hub' / 'hf:NAME' to download nyu-mll/glue when online; checked before any work starts (default: "
        "$REPLAYLOADER_DATA/glue when that exists; without it the finetune command uses the hub and compare skips "
        "fine-tuning)", DATA, convert=check_glue_dir)
    squad_dir: str | None = option(
        default_data_dir("squad"), "directory with train-v1.1.json(.gz) (or parts) and dev-v1.1.json(.gz), or "
        "'hub' / 'hf:NAME' (default: $REPLAYLOADER_DATA/squad when that exists, else the hub's rajpurkar/squad)", DATA)


@dataclass
class SubsetOptions:
    """How much of each task is used and how many fine-tuning runs there are."""

    max_train_examples: int | None = option(None, "seeded training subset size (questions for SQuAD; "
                                                  "none: all)", SUBSET, aliases=["--train-examples"])
    max_eval_examples: int | None = option(None, "seeded dev subset size (questions for SQuAD; none: all)",
                                           SUBSET, aliases=["--eval-examples"])
    subset_seed: int = option(0, "seed of the train/eval subsets, shared by every checkpoint and seed", SUBSET)
    seeds: list[int] = option(help="fine-tuning seeds (the new head's init, dropout, data order)", group=SUBSET,
                              default_factory=lambda: list(DEFAULT_SEEDS))


@dataclass
class TrainingOptions:
    """How each run trains: ELECTRA's recipe, with None taking the preset's or the task's value."""

    preset: str | None = option(None, "learning-rate / layer-decay preset: " + ", ".join(
        f"{name} {lr:g}/{decay:g}" for name, (lr, decay) in FINETUNE_PRESETS.items())
        + " (default: by the checkpoint's hidden size: small <= 256 < base <= 768 < large)", TRAINING,
        choices=FINETUNE_PRESETS)
    learning_rate: float | None = option(None, "learning rate (default: the preset's)", TRAINING, aliases=["--lr"])
    layer_decay: float | None = option(None, "layer-wise learning-rate decay (default: the preset's)", TRAINING)
    epochs: float | None = option(None, "epochs (default: the task's: 3; RTE, STS-B 10; SQuAD 2)", TRAINING)
    batch_size: int = option(32, "training batch size", TRAINING)
    sampling: str = option("uniform", "training batches: uniform (shuffled epochs) or prioritized (replayloader's "
                                      "PrioritizedSampler fed each example's loss: one shuffled pass, then "
                                      "P ~ loss, 10%% uniform draws, importance weights with beta 0.4 -> 1)",
                           TRAINING, choices=SAMPLINGS)
    amp: bool = option(False, "bf16 autocast on CUDA (CPU always runs float32)", TRAINING)
    device: str | None = option(None, "torch device: auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps "
                                      "(default: auto)", TRAINING)
    progress: bool = option(True, "progress bars and per-run log lines (--no-progress: none)", TRAINING)


@dataclass
class GlueOptions:
    max_length: int = option(128, "GLUE max sequence length", WINDOWS)


@dataclass
class SquadOptions:
    max_seq_length: int = option(384, "SQuAD window length", WINDOWS)
    doc_stride: int = option(128, "SQuAD step between window starts, ELECTRA/BERT meaning (not HF's overlap)",
                             WINDOWS)
    max_query_length: int = option(64, "SQuAD question tokens kept", WINDOWS)
    n_best: int = option(20, "SQuAD: candidate spans kept per question", WINDOWS)
    max_answer_length: int = option(30, "SQuAD: longest answer span, in tokens", WINDOWS)


@dataclass
class FinetuneCommand:
    """What the ``finetune`` command fine-tunes and where it writes."""

    checkpoint: list[str] = option(help="checkpoint directory (or hub id when online), as [NAME=]DIR; repeat the "
                                        "value for several; NAME labels its table row", group=RUN)
    task: list[str] = option(help=f"one or more of {', '.join(TASK_CHOICES)}; 'glue' = the eight tasks of the "
                                  "average", group=RUN, choices=TASK_CHOICES)
    output_dir: str = option(DEFAULT_OUTPUT_DIR, "where results.md, CSVs and per-run JSON go", RUN)


FINETUNE_OPTIONS = (FinetuneCommand, DataOptions, SubsetOptions, TrainingOptions, GlueOptions, SquadOptions)


def split_options(options: dict, *classes: type) -> tuple:
    """One instance of each of ``classes`` from a flat dict of their fields (the Python API's keywords); a
    keyword none of them declares is a TypeError naming it, as for any function."""
    names = {f.name for cls in classes for f in fields(cls)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {', '.join(unknown)}; options are {', '.join(sorted(names))}")
    return tuple(cls(**{f.name: options[f.name] for f in fields(cls) if f.name in options}) for cls in classes)
