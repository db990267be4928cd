"""Several buffer actors sampled as one buffer: the union's probabilities and importance weights are those of a
single buffer holding the same weights, exactly per example and in the draw frequencies (fixed seeds)."""
import numpy as np
import pytest

pytest.importorskip("ray")
from scipy import stats  # noqa: E402

from replayloader import ReplayBuffer  # noqa: E402
from replayloader.strategies import by_name  # noqa: E402
from replayloader.ray import RemoteBuffer, ShardedBuffer  # noqa: E402
from tests.core.helpers import assert_state_equal  # noqa: E402

ALPHA, BETA = 0.6, 0.4


@pytest.fixture(scope="module")
def filled(ray_cluster):
    """Three shards of unequal sizes and masses and one buffer holding the same 60 examples and weights."""
    rng = np.random.default_rng(0)
    shards = ShardedBuffer([RemoteBuffer(32, alpha=ALPHA, beta=BETA, strategy=by_name("per"), seed=s)
                            for s in range(3)], seed=0)
    single = ReplayBuffer(64, alpha=ALPHA, beta=BETA, strategy=by_name("per"), seed=0)
    weights = rng.gamma(0.5, size=60) + 0.01
    weights[[3, 17]] = 0.0  # never sampled, in either
    for shard, rows in enumerate((np.arange(0, 10), np.arange(10, 35), np.arange(35, 60))):
        batch = {"key": rows}
        shards.add(batch, weight=weights[rows], shard=shard)
        single.feedback(single.add(batch), weight=weights[rows])
    yield shards, single, weights
    for shard in shards.shards:
        shard.kill()


def expected_probabilities(weights):
    priorities = weights ** ALPHA
    return priorities / priorities.sum()


@pytest.mark.parametrize("sampling", ["stratified", "independent"])
def test_union_samples_like_one_buffer(filled, sampling):
    shards, single, weights = filled
    shards.sampling = sampling
    p = expected_probabilities(weights)
    reference = single.sample(64)
    counts = np.zeros(60)
    for _ in range(60):
        sample = shards.sample(64)
        keys = sample.data["key"]
        counts += np.bincount(keys, minlength=60)
        np.testing.assert_allclose(sample.probabilities, p[keys], rtol=1e-12)
        p_min = p[p > 0].min()
        np.testing.assert_allclose(sample.weights, (p_min / p[keys]) ** BETA, rtol=1e-12)
    # the single buffer reports the same probability and importance weight for the same example
    np.testing.assert_allclose(reference.probabilities, p[reference.data["key"]], rtol=1e-12)
    assert counts[[3, 17]].sum() == 0
    live = p > 0
    assert stats.chisquare(counts[live], counts.sum() * p[live]).pvalue > 1e-3


def test_update_routes_to_shards_and_a_rejected_one_changes_nothing(filled):
    shards, _, weights = filled
    sample = shards.sample(16)
    before = shards.state_dict()
    bad = [dict(weight=np.where(np.arange(16) == 5, np.nan, 1.0)), dict(weight=np.ones(15)), dict(wait=np.ones(16)),
           dict(weight=np.where(np.arange(16) == 5, shards.max_weight * 1.5, 1.0))]  # over every shard's bound
    for feedback in bad:
        with pytest.raises((ValueError, TypeError)):
            shards.feedback(sample.ids, **feedback)
    with pytest.raises(ValueError, match="was never issued"):
        shards.feedback(np.array([sample.ids[0], 3 * 10 ** 6]), weight=np.ones(2))
    assert_state_equal(before, shards.state_dict())
    # a good update lands on the right examples
    keys = sample.data["key"]
    assert shards.feedback(sample.ids, weight=np.full(16, 7.0)) > 0
    states = shards.state_dict()["shards"]
    stored = np.concatenate([states[str(s)]["weights"][:n] for s, n in enumerate((10, 25, 25))])
    assert (stored[keys] == 7.0).all()
    shards.load_state_dict(before)
    assert_state_equal(before, shards.state_dict())


def test_all_zero_weights_fall_back_to_uniform_over_every_stored_example(filled):
    shards, _, _ = filled
    before = shards.state_dict()
    zeroed = shards.state_dict()
    for state in zeroed["shards"].values():
        state["weights"] = np.zeros_like(state["weights"])  # arrays from the object store are read-only
    shards.load_state_dict(zeroed)
    sample = shards.sample(6000)
    np.testing.assert_allclose(sample.probabilities, 1 / 60)
    np.testing.assert_allclose(sample.weights, 1.0)
    assert stats.chisquare(np.bincount(sample.data["key"], minlength=60)).pvalue > 1e-3
    shards.load_state_dict(before)


@pytest.mark.parametrize("bad", [{"next_shard": 3}, {"next_shard": "1"}, {"rng": {"state": "no"}},
                                 {"shards": {"0": {}, "1": {}}}])
def test_a_refused_sharded_checkpoint_raises_invalid_state_before_any_shard_changes(filled, bad):
    """The whole state is checked through the shared state checks before any shard is sent its part (issue 33:
    every load raises InvalidState); a shard count that differs is one of those checks."""
    from replayloader import InvalidState

    shards, _, _ = filled
    before = shards.state_dict()
    with pytest.raises(InvalidState):
        shards.load_state_dict({**before, **bad})
    after = shards.state_dict()
    assert after["next_shard"] == before["next_shard"] and after["rng"] == before["rng"]
    for key in before["shards"]:
        assert_state_equal(after["shards"][key], before["shards"][key], path=key)
