"""``--log-every N``: the steps that log nothing read nothing off the device, and logging never changes training."""
from __future__ import annotations

import json
import shutil
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from safetensors.torch import load_file  # noqa: E402

from replayloader.loader.host_sync import count_host_transfers  # noqa: E402
from replayloader_electra.errors import UserError  # noqa: E402
from replayloader_electra.pretrain import VARIANTS, PretrainConfig, pretrain, read_metrics, resume_config  # noqa: E402
from replayloader_electra.pretrain import loop  # noqa: E402
from replayloader_electra.pretrain.config import buffer_strategy  # noqa: E402
from replayloader_electra.pretrain.corruption import CorruptionProducer  # noqa: E402


def tiny(corpus: dict, out, **overrides) -> PretrainConfig:
    settings = dict(preset="tiny", corpus=corpus["file"], vocab_size=200, max_len=32, batch_size=8, steps=7,
                    buffer_size=32, warmup_steps=2, output_dir=str(out), cache_dir=corpus["cache"], progress=False,
                    export_hf=False, variant="tmr-loss_diff", defer_feedback=True)
    settings.update(overrides)
    return PretrainConfig(**settings)


def transfers_per_step(config: PretrainConfig, monkeypatch) -> tuple[list[Counter], int]:
    """Host transfers of each step (from one producer call to the next) and the optimizer's parameter count."""
    optimizers, snapshots = [], []
    make_optimizer, produce = loop.make_optimizer, CorruptionProducer.__call__
    monkeypatch.setattr(loop, "make_optimizer", lambda *a, **k: optimizers.append(make_optimizer(*a, **k))
                        or optimizers[-1])
    monkeypatch.setattr(CorruptionProducer, "__call__", lambda self, raw: snapshots.append(Counter(moves))
                        or produce(self, raw))
    with count_host_transfers() as moves:  # every tensor on this CPU: what a GPU run would wait for, and more
        pretrain(config)
    parameters = sum(len(group["params"]) for group in optimizers[0].param_groups)
    return [after - before for before, after in zip(snapshots, snapshots[1:])], parameters


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_step_that_logs_nothing_reads_only_the_named_values_on_the_host(corpus, tmp_path, one_torch_thread,
                                                                          monkeypatch, variant):
    config = tiny(corpus, tmp_path / variant, variant=variant, steps=4, log_every=10)  # logs step 4 only
    steps, parameters = transfers_per_step(config, monkeypatch)
    expected = Counter({
        # AdamW reads each parameter's step counter with .item(). torch keeps these counters on the host on every
        # device (unless capturable or fused), so on a GPU they wait for nothing and count_host_transfers("cuda")
        # does not see them; on this CPU every tensor counts.
        "item": parameters,
        # transformers' ELECTRA asks `attention_mask.all()` in each forward (generator, discriminator) to decide
        # whether SDPA may drop the mask (a real wait on CUDA, inside transformers; skipped under torch.compile).
        "__bool__": 2,
    })
    if buffer_strategy(config.filled()).init.feature_based:
        # lsr / linucb score new examples from their token ids on the host by design (the buffer's initialiser)
        expected += Counter({"cpu": 1, "numpy": 1})
    # steps 2 and 3: not logged, and after the first step's one-off set-up (optimizer state, buffer filling)
    assert steps[1:3] == [expected, expected]


def test_logging_every_third_step_trains_exactly_as_logging_every_step(corpus, tmp_path, one_torch_thread):
    every = pretrain(tiny(corpus, tmp_path / "every", checkpoint_every=7))
    sparse = pretrain(tiny(corpus, tmp_path / "sparse", log_every=3, checkpoint_every=4, keep_checkpoints=5))
    shutil.copytree(tmp_path / "sparse", tmp_path / "resumed")
    resumed = pretrain(resume_config(str(tmp_path / "resumed" / "checkpoints" / "step-00000004"), log_every=5,
                                     output_dir=str(tmp_path / "resumed"), progress=False))

    def training_values(run) -> dict[int, dict]:  # everything but the timings
        return {r["step"]: {k: v for k, v in r.items() if not k.endswith("seconds")}
                for r in read_metrics(run.metrics_path)}

    full = training_values(every)
    assert list(full) == list(range(1, 8))
    # log every 3rd step, the checkpoint's (4) and the last; resumed at 4 with --log-every 5: 5 and the last
    for run, steps in ((sparse, [3, 4, 6, 7]), (resumed, [3, 4, 5, 7])):
        logged = training_values(run)
        assert list(logged) == steps
        assert logged == {step: full[step] for step in steps}
        final = load_file(f"{run.output_dir}/checkpoints/step-00000007/tensors.safetensors")
        reference = load_file(f"{every.output_dir}/checkpoints/step-00000007/tensors.safetensors")
        assert final.keys() == reference.keys()
        assert all(torch.equal(final[name], reference[name]) for name in reference)
    assert json.loads((tmp_path / "resumed" / "config.json").read_text())["log_every"] == 5


def test_log_every_below_one_is_a_user_error_naming_the_flag():
    with pytest.raises(UserError, match=r"--log-every must be >= 1, got 0"):
        PretrainConfig(log_every=0).filled()


def test_one_process_loss_shares_are_one_without_reading_the_counts():
    from replayloader_electra.pretrain.distributed import World

    with count_host_transfers() as moves:
        shares = World().loss_shares(torch.tensor(5), torch.tensor(7.0))
    assert shares == (1.0, 1.0) and not moves
