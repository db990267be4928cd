"""Feedback keywords come from the update that reads them: a user's update with a signal of its own works in the
buffer and in the sampler alike, and any other keyword is refused with the accepted ones listed."""
import copy

import numpy as np
import pytest

from replayloader import PrioritizedSampler, ReplayBuffer
from replayloader.strategies import FIFO, MeanWeight, NoReplay, Strategy, WeightUpdate

from .helpers import assert_state_equal


class MarginUpdate(WeightUpdate):
    """A rule on a signal the library does not know: the smaller an example's margin, the higher its weight."""

    name = "margin"
    feedback_key = "margin"

    def compute(self, slots, values):
        return np.ones(len(values), bool), 1.0 / (values + 0.5)


class UncertaintyUpdate(WeightUpdate):
    """Reads an array keyword of its own (class probabilities, one row per example) and derives the values."""

    name = "uncertainty"
    array_keywords = ("probs",)

    def values(self, feedback):
        return 1.0 - np.asarray(feedback["probs"]).max(axis=-1)


class Target:
    """The same feedback calls on a 4-example `ReplayBuffer` or `PrioritizedSampler`, all 4 examples handed out."""

    def __init__(self, kind, update):
        self.kind = kind
        if kind == "buffer":
            self.obj = ReplayBuffer(4, strategy=Strategy(MeanWeight(), update, FIFO()), seed=0)
            self.handle = self.obj.add({"x": np.arange(4.0)[:, None]})
        else:
            self.obj = PrioritizedSampler(4, 4, update=update, init=MeanWeight(), seed=0)
            batch = self.obj.next_batch()
            order = np.argsort(batch.indices)
            self.handle = batch.indices[order]

    def feedback(self, **feedback):
        return self.obj.feedback(self.handle, **feedback)

    def weights(self):
        return self.obj.weights[self.handle] if self.kind == "sampler" else self.obj.weights.copy()

    def state(self):
        return copy.deepcopy(self.obj.state_dict())


KINDS = ["buffer", "sampler"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_user_update_reads_a_keyword_of_its_own(kind):
    target = Target(kind, MarginUpdate())
    assert target.feedback(margin=np.array([0.0, 0.5, 1.5, 9.5])) == 4
    np.testing.assert_allclose(target.weights(), [2.0, 1.0, 0.5, 0.1])


@pytest.mark.parametrize("kind", KINDS)
def test_a_user_update_derives_its_values_from_an_array_keyword(kind):
    target = Target(kind, UncertaintyUpdate())
    probs = np.array([[0.5, 0.5], [0.9, 0.1], [0.2, 0.8], [1.0, 0.0]])
    assert target.feedback(probs=probs) == 4
    np.testing.assert_allclose(target.weights(), [0.5, 0.1, 0.2, 1e-6])  # 0 is raised to the default floor


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("update, feedback, error, message", [
    (MarginUpdate(), {"loss": np.ones(4)}, TypeError, r"'loss' for MarginUpdate; accepted: \['margin'\]"),
    (MarginUpdate(), {"margin": np.ones(4), "magrin": np.ones(4)}, TypeError, r"'magrin'.*accepted: \['margin'\]"),
    (MarginUpdate(), {"margin": np.array([1.0, np.nan, 1.0, 1.0])}, ValueError, r"margin\[1\] = nan"),
    (MarginUpdate(), {"margin": np.ones(3)}, ValueError, r"margin must have shape \(4,\)"),
    (MarginUpdate(), {}, TypeError, "needs the keyword 'margin'"),
    (UncertaintyUpdate(), {"margin": np.ones(4)}, TypeError, r"accepted: \['probs'\]"),
    (UncertaintyUpdate(), {"probs": np.full((4, 2), 1.5)}, ValueError, r"feedback\[0\] = -0.5"),
    (UncertaintyUpdate(), {"probs": np.ones((3, 2))}, ValueError, r"feedback must have shape \(4,\)"),
])
def test_bad_feedback_for_a_user_update_is_refused_and_changes_nothing(kind, update, feedback, error, message):
    target = Target(kind, update)
    before = target.state()
    with pytest.raises(error, match=message):
        target.feedback(**feedback)
    assert_state_equal(target.state(), before)


def test_no_replay_accepts_the_signal_of_every_built_in_update_and_no_other():
    buf = ReplayBuffer(4, strategy=NoReplay(), seed=0)
    ids = buf.add({"x": np.zeros((4, 1))})
    for key in ("loss", "grad_norm", "grad_bound", "weight"):
        assert buf.feedback(ids, **{key: np.ones(4)}) == 0
    assert buf.feedback(ids, logits=np.zeros((4, 3)), targets=np.zeros((4, 3))) == 0
    with pytest.raises(TypeError, match=r"'margin' for NoFeedback; accepted: \['loss', 'grad_norm', 'grad_bound', "
                                        r"'weight', 'logits', 'targets', 'mask'\]"):
        buf.feedback(ids, margin=np.ones(4))
    with pytest.raises(ValueError, match=r"grad_norm\[0\] = -1"):  # accepted, so checked, though never read
        buf.feedback(ids, grad_norm=-np.ones(4))
