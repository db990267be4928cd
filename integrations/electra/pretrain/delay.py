"""A fixed-age delay line between generator and discriminator (``--delay-steps D``, the `electra` variant's control).

At step t the discriminator trains on exactly the corrupted batch the generator made at step t − D, once, while
the joint loss keeps the current step's L_G: every row is D steps old and none is mixed with rows of other ages,
which separates the age of replayed examples from the mixing of a replay window (results/reproduce_tmr/REPRODUCTION.md,
"Measurement 3"). ELECTRA is D = 0, where no delay line is built at all.

While the queue fills (steps 1..D) the discriminator trains on the oldest batch queued, the first one, at ages
0, 1, ..., D − 1; from step D + 1 on every batch is D steps old. Like a replay window that is still filling
(whose first batches are drawn many times), the early batch is repeated instead of a step being skipped. The
age of each step's rows goes out as ``aux["delay_age"]``; the step's record adds it to the buffer's ages
(`metrics.step_record`), so ``sample_age_mean`` reads 0..D − 1, then D.

`DelayLine` wraps the producer and declares its queue to `replayloader.ReplayDataLoader`, which checkpoints it
with the loader's own state, so a killed run resumes exactly, also while the queue is still filling.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..errors import UserError


class DelayLine:
    """``producer(raw) -> (examples, aux)`` whose examples come out ``steps`` calls later (see the module doc)."""

    def __init__(self, producer: Callable[[Any], tuple[dict, dict]], steps: int) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise UserError(f"--delay-steps of a delay line must be an integer >= 1, got {steps!r}")
        self.producer = producer
        self.steps = steps
        self.queue: deque[dict[str, torch.Tensor]] = deque()  # oldest first; at most `steps` between calls

    def __call__(self, raw: Mapping[str, torch.Tensor]) -> tuple[dict, dict]:
        examples, aux = self.producer(raw)
        self.queue.append({name: value.detach() for name, value in examples.items()})
        if len(self.queue) > self.steps:
            oldest, age = self.queue.popleft(), self.steps
        else:  # filling: the first batch, at age 0..steps-1
            oldest, age = self.queue[0], len(self.queue) - 1
        device = next(iter(examples.values())).device  # a resumed queue comes back on the CPU
        return {name: value.to(device) for name, value in oldest.items()}, {**aux, "delay_age": age}

    def loader_state_dict(self) -> dict:
        """The queued batches (tensors, saved in the checkpoint's safetensors) and the delay they were made for."""
        return {"steps": self.steps, "queue": [dict(batch) for batch in self.queue]}

    def load_loader_state_dict(self, state: Mapping) -> None:
        """Restore the queue; a queue of another delay, or one that does not fit it, is refused unchanged."""
        saved, queue = state.get("steps"), state.get("queue")
        if saved != self.steps:
            raise UserError(f"--delay-steps {self.steps} does not match the checkpoint's delay line of {saved!r} "
                            f"steps: resume with --delay-steps {saved!r}")
        if not isinstance(queue, list) or len(queue) > self.steps or not all(
                isinstance(batch, Mapping) and all(isinstance(v, torch.Tensor) for v in batch.values())
                for batch in queue):
            raise UserError(f"the checkpoint's delay-line queue is not a list of at most {self.steps} batches of "
                            "tensors")
        self.queue = deque(dict(batch) for batch in queue)


def delayed(producer: Callable[[Any], tuple[dict, dict]], steps: int) -> Callable[[Any], tuple[dict, dict]]:
    """``producer`` behind a delay line of ``steps`` (``--delay-steps``); itself, unchanged, for 0."""
    return DelayLine(producer, steps) if steps else producer
