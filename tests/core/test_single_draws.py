"""The batched draws `MixtureSampler` makes into its sources' samplers, held equal to the one-at-a-time forms they
replace: `PrioritizedSampler._single_draws` (k draws of a batch_size=1 sampler in one call) against k calls of
`next_batch`, and `kernels.rng.permutation` (a radix sort) against numpy's stable argsort of the same uniforms."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from replayloader import PrioritizedSampler
from replayloader.kernels.rng import permutation, seed_state, uniforms
from replayloader.strategies import LossDifference, LossValue, MaxWeight, MeanWeight
from tests.core.helpers import assert_state_equal


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 300), seed=st.integers(0, 2**32 - 1))
def test_the_radix_permutation_is_numpys_stable_argsort_of_the_same_uniforms(n, seed):
    mine, numpys = seed_state(seed), seed_state(seed)
    np.testing.assert_array_equal(permutation(mine, n), np.argsort(uniforms(numpys, n), kind="stable"))
    np.testing.assert_array_equal(mine, numpys)  # the generator advanced past the same n uniforms


@pytest.mark.parametrize("n", [31, 32, 2048, 40_000])
def test_the_radix_permutation_matches_at_the_sizes_where_its_method_changes(n):
    mine, numpys = seed_state(n), seed_state(n)
    np.testing.assert_array_equal(permutation(mine, n), np.argsort(uniforms(numpys, n), kind="stable"))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 40), seed=st.integers(0, 1000), warmup=st.integers(0, 2),
       uniform_fraction=st.sampled_from([0.0, 0.3, 1.0]), alpha=st.sampled_from([0.0, 0.7, 1.0]),
       sampling=st.sampled_from(["stratified", "independent"]), update=st.sampled_from(["value", "difference"]),
       init=st.sampled_from(["mean", "max"]), counts=st.lists(st.integers(1, 90), min_size=1, max_size=8))
def test_single_draws_are_the_indices_and_state_of_as_many_one_index_batches(n, seed, warmup, uniform_fraction, alpha,
                                                                         sampling, update, init, counts):
    """Across warm-up passes, epoch ends (where unmeasured examples are rescored) and feedback between calls."""
    def make():
        return PrioritizedSampler(n, 1, seed=seed, warmup_epochs=warmup, uniform_fraction=uniform_fraction,
                                  alpha=alpha, sampling=sampling,
                                  update=LossValue() if update == "value" else LossDifference(),
                                  init=MeanWeight() if init == "mean" else MaxWeight())

    batched, one_by_one = make(), make()
    for j, count in enumerate(counts):
        out = np.full(count, -1, np.int64)
        batched._single_draws(out)
        expected = np.array([one_by_one.next_batch().indices[0] for _ in range(count)])
        np.testing.assert_array_equal(out, expected)
        loss = 0.1 + (out % 5) * 0.4 + 0.01 * j
        batched.feedback(out, loss=loss)
        one_by_one.feedback(expected, loss=loss)
        assert_state_equal(batched.state_dict(), one_by_one.state_dict())


def test_single_draws_need_a_sampler_of_one_index_per_batch():
    with pytest.raises(ValueError, match="batch_size=1, this one has 4"):
        PrioritizedSampler(10, 4, seed=0)._single_draws(np.empty(3, np.int64))
