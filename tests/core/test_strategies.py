"""Each strategy's semantics on small hand-worked cases."""
import numpy as np
import pytest

from replayloader import ReplayBuffer
from replayloader.strategies import (FIFO, EvictLowest, GradBound, GradNorm, LeastSquares, LinUCB, LossDifference,
                                     LossValue, MaxWeight, MeanWeight, NoReplay, SetWeight, Strategy, by_name,
                                     grad_bound_sigmoid, grad_bound_softmax)


def tokens(n, start=0, width=2):
    return {"input_ids": (np.arange(start, start + n)[:, None] + np.zeros(width, np.int64)).astype(np.int64)}


def test_loss_difference_waits_for_the_second_visit():
    buf = ReplayBuffer(4, strategy=Strategy(MeanWeight(), LossDifference(), EvictLowest()))
    ids = buf.add(tokens(4))
    assert buf.feedback(ids[:2], loss=np.array([0.9, 0.5])) == 0  # first visit: remember, keep weight 1.0
    np.testing.assert_array_equal(buf.weights, [1, 1, 1, 1])
    assert buf.feedback(ids[:2], loss=np.array([0.6, 0.7])) == 2  # second visit: |0.9-0.6|, |0.5-0.7|
    np.testing.assert_allclose(buf.weights, [0.3, 0.2, 1, 1])
    buf.feedback(ids[:1], loss=np.array([0.6]))  # no change in loss -> the floor, never 0
    assert buf.weights[0] == 1e-6


def test_loss_difference_decrease_mode_and_reset_on_eviction():
    buf = ReplayBuffer(2, strategy=Strategy(MeanWeight(), LossDifference(mode="decrease", floor=0.01), FIFO()))
    ids = buf.add(tokens(2))
    buf.feedback(ids, loss=np.array([0.5, 0.5]))
    buf.feedback(ids, loss=np.array([0.2, 0.9]))  # a decrease of 0.3; an increase counts as no progress
    np.testing.assert_allclose(buf.weights, [0.3, 0.01])
    new = buf.add(tokens(1, 10))  # FIFO refills slot 0: its remembered loss must be forgotten
    assert buf.feedback(new, loss=np.array([0.1])) == 0


def test_mean_weight_initializer_uses_current_mean():
    buf = ReplayBuffer(10, strategy=Strategy(MeanWeight(), SetWeight(), EvictLowest()))
    ids = buf.add(tokens(3))
    buf.feedback(ids, weight=np.array([1.0, 2.0, 6.0]))
    buf.add(tokens(2, 3))
    np.testing.assert_allclose(buf.weights[:5], [1, 2, 6, 3, 3])


def test_max_weight_initializer_applies_alpha_once():
    buf = ReplayBuffer(10, alpha=0.5, strategy=Strategy(MaxWeight(), SetWeight(), FIFO()))
    ids = buf.add(tokens(2))
    buf.feedback(ids, weight=np.array([4.0, 9.0]))
    buf.add(tokens(1, 2))
    assert buf.weights[2] == 9.0 and buf.tree.get(np.array([2]))[0] == 3.0


def test_value_updates_use_their_feedback():
    for update, key in ((LossValue(), "loss"), (GradNorm(), "grad_norm"), (GradBound(), "grad_bound")):
        buf = ReplayBuffer(3, strategy=Strategy(MeanWeight(), update, EvictLowest()))
        ids = buf.add(tokens(3))
        buf.feedback(ids, **{key: np.array([0.5, 0.0, 2.0])})
        np.testing.assert_allclose(buf.weights, [0.5, 1e-6, 2.0])


def test_grad_bound_from_sigmoid_logits_matches_autograd_by_hand():
    z = np.array([[0.0, 2.0, -1.0], [1.0, 1.0, 1.0]])
    y = np.array([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    mask = np.array([[1, 1, 0], [1, 1, 1]])
    sig = 1 / (1 + np.exp(-z))
    # d/dz of mean_t BCE(z_t, y_t) over unmasked t is (sigmoid(z_t) - y_t) / n_unmasked
    want = [np.linalg.norm((sig[0] - y[0])[:2]) / 2, np.linalg.norm(sig[1] - y[1]) / 3]
    np.testing.assert_allclose(grad_bound_sigmoid(z, y, mask), want)
    buf = ReplayBuffer(2, strategy=Strategy(MeanWeight(), GradBound(), EvictLowest()))
    ids = buf.add(tokens(2))
    buf.feedback(ids, logits=z, targets=y, mask=mask)
    np.testing.assert_allclose(buf.weights, want)


def test_grad_bound_softmax_matches_finite_differences():
    rng = np.random.default_rng(0)
    z, y = rng.normal(size=(2, 5)), np.array([1, 3])

    def loss(row, target):
        return -(row[target] - np.log(np.exp(row).sum()))

    for i in range(2):
        grad = [(loss(z[i] + d, y[i]) - loss(z[i] - d, y[i])) / 2e-6 for d in np.eye(5) * 1e-6]
        assert grad_bound_softmax(z, y)[i] == pytest.approx(np.linalg.norm(grad), rel=1e-6)


def test_evict_lowest_and_fifo_choose_different_victims():
    for evict, victim in ((EvictLowest(), 1), (FIFO(), 0)):
        buf = ReplayBuffer(3, strategy=Strategy(MeanWeight(), SetWeight(), evict))
        ids = buf.add(tokens(3))
        buf.feedback(ids, weight=np.array([2.0, 0.5, 3.0]))
        assert buf.add(tokens(1, 5))[0] % 3 == victim


def test_least_squares_fits_known_linear_weights():
    theta = np.array([0.5, 0.25])
    buf = ReplayBuffer(20, strategy=Strategy(LeastSquares(), SetWeight(), EvictLowest()))
    x = np.random.default_rng(0).integers(1, 50, size=(10, 2))
    ids = buf.add({"input_ids": x})
    buf.feedback(ids, weight=x @ theta)
    new = np.array([[4, 8], [10, 2]])
    buf.add({"input_ids": new})
    np.testing.assert_allclose(buf.weights[10:12], new @ theta, rtol=1e-9)


def test_linucb_learns_linear_rewards_and_refreshes_unsampled():
    theta = np.array([1.0, 2.0])
    strategy = Strategy(LinUCB(exploration=0.0), SetWeight(), EvictLowest())
    buf = ReplayBuffer(50, strategy=strategy)
    rng = np.random.default_rng(1)
    x = rng.integers(1, 20, size=(20, 2))
    ids = buf.add({"input_ids": x})
    pending = buf.add({"input_ids": np.array([[3, 3]])})  # never sampled: LinUCB keeps re-scoring it
    buf.feedback(ids, weight=x @ theta)
    # ridge (A = I + X^T X) solution, close to theta after 20 exact rewards
    assert buf.weights[20] == pytest.approx(9.0, rel=1e-2)
    a = np.eye(2) + x.T @ x
    np.testing.assert_allclose(strategy.init.A, a)
    np.testing.assert_allclose(strategy.init.b, x.T @ (x @ theta))
    assert pending.shape == (1,)
    # exploration widens the score of an uncertain example
    wide = LinUCB(exploration=1.0)
    wide.A, wide.b = strategy.init.A.copy(), strategy.init.b.copy()
    assert wide.scores(np.array([[3.0, 3.0]]))[0] > buf.weights[20]


def test_no_replay_returns_exactly_the_latest_add():
    buf = ReplayBuffer(8, strategy=NoReplay(), seed=0)
    for start in (0, 4, 8):
        ids = buf.add(tokens(4, start))
        s = buf.sample(4)
        np.testing.assert_array_equal(s.ids, ids)
        np.testing.assert_array_equal(s.data["input_ids"][:, 0], np.arange(start, start + 4))
        assert buf.feedback(s.ids, loss=np.ones(4)) == 0
    with pytest.raises(ValueError, match="latest add"):
        buf.sample(5)


def test_by_name_covers_the_paper_variants():
    for name in ("none", "loss_diff", "grad_norm", "grad_bound", "loss", "lsr", "linucb"):
        assert by_name(name).config()["no_replay"] == (name == "none")
    with pytest.raises(ValueError, match="unknown strategy name 'grad-norm'"):
        by_name("grad-norm")
    with pytest.raises(TypeError, match="init must be"):
        Strategy(init=LossDifference())


def test_initializer_with_wrong_output_shape_is_rejected_clearly():
    class Broken(MeanWeight):
        def initial_weights(self, view, n, features):
            return np.ones((n, 2))

    buf = ReplayBuffer(4, strategy=Strategy(Broken(), SetWeight(), EvictLowest()))
    with pytest.raises(ValueError, match="invalid initial weights"):
        buf.add(tokens(2))
    assert len(buf) == 0


def test_strategy_describe_of_1_0_is_config_with_a_deprecation_warning():
    strategy = by_name("loss_diff")
    with pytest.warns(DeprecationWarning, match=r"Strategy\.describe\(\) is deprecated .*use \.config\(\)"):
        assert strategy.describe() == strategy.config()
