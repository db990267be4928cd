"""Fine-tuning and evaluation of pretrained discriminators on GLUE and SQuAD v1.1 (the TMR paper's setup).

Entry points: ``finetune_glue_task``, ``finetune_glue``, ``finetune_squad`` (Python) and
``add_finetune_subparser`` (command line). See README.md in this folder.
"""

__all__ = ["add_finetune_subparser", "finetune_glue", "finetune_glue_task", "finetune_squad"]


def __getattr__(name: str):
    # Lazy, so that importing the package (e.g. for the CLI's parser) does not import torch.
    if name in ("finetune_glue", "finetune_glue_task", "finetune_squad"):
        from . import api

        return getattr(api, name)
    if name == "add_finetune_subparser":
        from .cli import add_finetune_subparser

        return add_finetune_subparser
    raise AttributeError(name)
