"""ELECTRA and TMR (Transformer with Memory Replay) pretraining on replayloader.

Modules, one job each: `data` (corpus -> tokenizer -> packed, cached examples), `models` (presets and the
generator/discriminator pair with shared embeddings), `pretrain` (the training loop), `grad_norms`
(per-example gradient norms and the logit bound), `cli` (command line). Fine-tuning lives in `finetune`.
"""
