"""Pretraining with ``defer_feedback``: the same run, minus the feedback's wait for the device in every step."""
from __future__ import annotations

from replayloader_electra.pretrain.config import PretrainConfig
from replayloader_electra.pretrain.loop import pretrain
from replayloader.loader.host_sync import count_host_transfers


def _run(corpus, out, defer: bool, steps: int):
    config = PretrainConfig(preset="tiny", corpus=corpus["file"], vocab_size=200, max_len=32, batch_size=8,
                            steps=steps, buffer_size=32, warmup_steps=2, output_dir=str(out),
                            cache_dir=corpus["cache"], progress=False, export_hf=False, variant="tmr-loss_diff",
                            defer_feedback=defer)
    with count_host_transfers() as moves:
        result = pretrain(config)
    return result.losses, sum(moves.values())


def test_deferred_feedback_gives_the_same_losses_without_the_feedback_copies(corpus, tmp_path, one_torch_thread):
    steps = 6
    sync_losses, sync_moves = _run(corpus, tmp_path / "sync", defer=False, steps=steps)
    deferred_losses, deferred_moves = _run(corpus, tmp_path / "deferred", defer=True, steps=steps)
    assert deferred_losses == sync_losses
    # Each step's loss feedback costs a .cpu() and a .numpy() when applied at once; deferred, it is copied
    # without waiting and read from a host staging tensor. Everything else in the run is identical.
    assert sync_moves - deferred_moves == 2 * steps
