"""The fixed-age delay line (``--delay-steps D``): exact ages, the current L_G, validation, and exact resume."""
from __future__ import annotations

import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from replayloader_electra.errors import UserError  # noqa: E402
from replayloader_electra.pretrain import PretrainConfig, pretrain, read_metrics, resume_config  # noqa: E402
from replayloader_electra.pretrain.delay import DelayLine, delayed  # noqa: E402

from .test_pretrain import tiny_config  # noqa: E402


class Counting:
    """A producer whose step-t batch is filled with t, with a loss that still carries a graph."""

    def __init__(self) -> None:
        self.calls = 0
        self.weight = torch.ones((), requires_grad=True)

    def __call__(self, raw):
        self.calls += 1
        made = torch.full((2, 3), float(self.calls)) * self.weight  # carries the graph, like a careless producer
        return {"input_ids": made, "masked": torch.ones(2, 3, dtype=torch.bool)}, \
            {"generator_loss": self.weight * self.calls}


def reference_rows(steps: int, delay: int) -> list[tuple[int, int]]:
    """(step whose batch the discriminator gets, its age) at steps 1..steps: t − D once full; step 1 while filling."""
    return [(t - delay, delay) if t > delay else (1, t - 1) for t in range(1, steps + 1)]


@settings(max_examples=30, deadline=None)
@given(delay=st.integers(1, 6), steps=st.integers(1, 20))
def test_each_step_gets_the_batch_made_delay_steps_earlier_detached_with_the_current_generator_loss(delay, steps):
    line = DelayLine(Counting(), delay)
    got = []
    for t in range(1, steps + 1):
        examples, aux = line(None)
        assert not examples["input_ids"].requires_grad  # no graph of an old step is kept or trained through
        assert aux["generator_loss"].requires_grad and float(aux["generator_loss"].detach()) == t  # this step's L_G
        assert len(line.queue) == min(t, delay)  # between calls: the D newest batches (fewer while filling)
        got.append((int(examples["input_ids"][0, 0]), aux["delay_age"]))
    assert got == reference_rows(steps, delay)


def test_no_delay_is_the_producer_itself():
    producer = Counting()
    assert delayed(producer, 0) is producer
    assert isinstance(delayed(producer, 2), DelayLine)


@pytest.mark.parametrize("cut", [1, 2, 5])  # while the queue fills (1, 2 of 3) and once it is full
def test_a_restored_queue_continues_exactly(cut):
    first, second = DelayLine(Counting(), 3), DelayLine(Counting(), 3)
    for _ in range(cut):
        first(None)
    second.producer.calls = cut  # the producer's own position is the loader's business, not the line's
    second.load_loader_state_dict(first.loader_state_dict())
    for _ in range(6):
        (a, age_a), (b, age_b) = first(None), second(None)
        assert torch.equal(a["input_ids"], b["input_ids"]) and age_a["delay_age"] == age_b["delay_age"]


def test_a_queue_of_another_delay_or_shape_is_refused_unchanged():
    line = DelayLine(Counting(), 3)
    line(None)
    before = line.loader_state_dict()
    with pytest.raises(UserError, match="--delay-steps 3 does not match the checkpoint's delay line of 2"):
        line.load_loader_state_dict({"steps": 2, "queue": []})
    with pytest.raises(UserError, match="at most 3 batches"):
        line.load_loader_state_dict({"steps": 3, "queue": [before["queue"][0]] * 4})
    with pytest.raises(UserError, match="batches of tensors"):
        line.load_loader_state_dict({"steps": 3, "queue": [{"input_ids": [1, 2]}]})
    assert line.queue[0]["input_ids"] is before["queue"][0]["input_ids"] and len(line.queue) == 1
    with pytest.raises(UserError, match=">= 1"):
        DelayLine(Counting(), 0)


@pytest.mark.parametrize("overrides, fragment", [
    ({"delay_steps": -1}, "--delay-steps must be an integer >= 0, got -1"),
    ({"delay_steps": 1.5}, "--delay-steps must be an integer >= 0, got 1.5"),
    ({"delay_steps": 3, "variant": "tmr-loss_diff"}, "--delay-steps is the electra variant's control"),
])
def test_bad_delay_options_are_user_errors_naming_the_flag(overrides, fragment):
    with pytest.raises(UserError, match=fragment):
        PretrainConfig(**{"variant": "electra", **overrides}).filled()


def test_delay_run_logs_ages_keeps_the_current_generator_loss_and_resumes_exactly(corpus, tmp_path):
    """Checkpoints at steps 2 (queue filling: 2 of 3 batches), 4 and 6 (full); resuming from 2 and from 6 gives
    the uninterrupted run's numbers, and changing --delay-steps on resume is refused."""
    config = tiny_config(corpus, tmp_path / "full", variant="electra", delay_steps=3, steps=8, checkpoint_every=2,
                         keep_checkpoints=0)
    full = read_metrics(pretrain(config).metrics_path)
    assert [r["sample_age_mean"] for r in full] == [0, 1, 2, 3, 3, 3, 3, 3]
    assert [r["fresh_fraction"] for r in full] == [1.0] + [0.0] * 7  # rows made this step: only at step 1
    plain = read_metrics(pretrain(tiny_config(corpus, tmp_path / "plain", variant="electra", steps=2)).metrics_path)
    assert full[0]["loss"] == plain[0]["loss"]  # step 1: both train on batch 1
    # step 2: the same generator (after the same step 1) on batch 2, so L_G is equal; D trains on batch 1 again
    assert full[1]["generator_loss"] == plain[1]["generator_loss"]
    assert full[1]["discriminator_loss"] != plain[1]["discriminator_loss"]
    for step in (2, 6):
        run = tmp_path / f"from{step}"
        shutil.copytree(tmp_path / "full", run)
        pretrain(resume_config(str(run / "checkpoints" / f"step-{step:08d}"), output_dir=str(run)))
        again = read_metrics(run / "metrics.jsonl")
        for key in ("loss", "generator_loss", "discriminator_loss", "sample_age_mean", "replaced_auc"):
            assert [r[key] for r in again] == [r[key] for r in full], (step, key)
    with pytest.raises(UserError, match="--delay-steps 0 on --resume: the run was started with --delay-steps 3"):
        resume_config(str(tmp_path / "full"), delay_steps=0)
