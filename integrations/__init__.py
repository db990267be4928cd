"""Integrations of replayloader with training code (ELECTRA/TMR pretraining and fine-tuning)."""
