"""MixtureSampler against a plain numpy reference written here, one step at a time: the slots' sources by
``searchsorted`` on the normalised cumulative weights, each source's examples from its own permutation
(``argsort`` of uniforms, reshuffled at the end of a pass) or one `PrioritizedSampler.next_batch` per slot, and
feedback as per-source ``bincount`` means. The sampler does all of it in compiled passes and batched calls per
source (issue 41); the streams, the rule's inputs and the counters must be the very same."""
import numpy as np
from hypothesis import given, settings, strategies as st

from replayloader import PrioritizedSampler
from replayloader.kernels.rng import seed_state, uniforms
from replayloader.mixing import ODM, ExcessLoss, FixedMixture, MixtureSampler
from replayloader.strategies import MaxWeight, MeanWeight
from tests.core.helpers import assert_state_equal


class Reference:
    """The mixture of `MixtureSampler`'s docs, in numpy and Python loops (a source per contiguous block)."""

    def __init__(self, sizes, batch_size, rule, seed, within, prioritized):
        self.sizes, self.batch_size, self.rule, self.within = np.asarray(sizes), batch_size, rule, within
        self.k = len(sizes)
        rule.bind(self.k)
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.source_of = np.repeat(np.arange(self.k), sizes)
        self.rng = seed_state(seed)
        self.order = [None] * self.k
        self.cursor = np.zeros(self.k, np.int64)
        self.drawn, self.fed_back = np.zeros(self.k, np.int64), np.zeros(self.k, np.int64)
        if within == "uniform":
            for k in range(self.k):
                self.reshuffle(k)
        self.samplers = [PrioritizedSampler(int(size), 1, **prioritized,
                                            seed=int(np.random.SeedSequence([seed, k]).generate_state(1)[0]))
                         for k, size in enumerate(sizes)] if within == "prioritized" else []

    def reshuffle(self, k):
        self.order[k] = np.argsort(uniforms(self.rng, int(self.sizes[k])), kind="stable")
        self.cursor[k] = 0

    def take_one(self, k):
        if self.within == "prioritized":
            return int(self.samplers[k].next_batch().indices[0])
        if self.cursor[k] == self.sizes[k]:
            self.reshuffle(k)
        self.cursor[k] += 1
        return int(self.order[k][self.cursor[k] - 1])

    def next_batch(self):
        weights = self.rule.weights()
        cdf = np.cumsum(weights)
        cdf /= cdf[-1]
        sources = np.minimum(np.searchsorted(cdf, uniforms(self.rng, self.batch_size), side="right"), self.k - 1)
        indices = np.empty(self.batch_size, np.int64)
        for k in range(self.k):  # sources in ascending order, slots in slot order
            for slot in np.flatnonzero(sources == k):
                indices[slot] = self.offsets[k] + self.take_one(k)
        self.drawn += np.bincount(sources, minlength=self.k)
        return indices, sources, weights

    def feedback(self, indices, losses):
        sources = self.source_of[indices]
        counts = np.bincount(sources, minlength=self.k)
        sums = np.bincount(sources, weights=losses, minlength=self.k)
        self.rule.feedback(np.divide(sums, counts, out=np.zeros(self.k), where=counts > 0), counts)
        self.fed_back += counts
        for k in np.flatnonzero(counts) if self.samplers else ():
            mine = sources == k
            self.samplers[k].feedback(indices[mine] - self.offsets[k], loss=losses[mine])


RULES = {"odm": lambda k: ODM(warmup_steps=2), "fixed": lambda k: FixedMixture(np.arange(1, k + 1) / (k * (k + 1) / 2)),
         "excess": lambda k: ExcessLoss(np.linspace(0.5, 1.5, k))}


@settings(max_examples=80, deadline=None)
@given(sizes=st.lists(st.integers(1, 25), min_size=1, max_size=4), batch_size=st.integers(1, 24),
       seed=st.integers(0, 10_000), rule=st.sampled_from(sorted(RULES)),
       within=st.sampled_from(["uniform", "prioritized"]),
       warmup=st.integers(0, 1), uniform_fraction=st.sampled_from([0.0, 0.25]), init=st.sampled_from(["mean", "max"]),
       plan=st.lists(st.tuples(st.booleans(), st.integers(0, 2**31)), min_size=1, max_size=14),
       reload_at=st.integers(0, 16))
def test_the_sampler_draws_and_learns_as_the_step_by_step_reference(sizes, batch_size, seed, rule, within, warmup,
                                                                   uniform_fraction, init, plan, reload_at):
    """``plan``: per step, whether its batch is fed back, and a seed for which of its examples (some twice) and
    their losses. ``init="max"`` (an initializer that watches feedback) takes the sources' feedback one sampler
    at a time, ``"mean"`` in one compiled pass (`sampler.groups`); warm-up passes and epoch ends take the draws
    one sampler at a time. Before step ``reload_at`` the run moves to another sampler of the same settings that
    had drawn and learned from other batches, by loading the state (a group's compiled pass must then use what
    was loaded, not what its samplers held before)."""
    def options():
        return {"warmup_epochs": warmup, "uniform_fraction": uniform_fraction,
                "init": MeanWeight() if init == "mean" else MaxWeight()} if within == "prioritized" else {}

    sampler = MixtureSampler(sizes, batch_size=batch_size, rule=RULES[rule](len(sizes)), seed=seed, within=within,
                             prioritized=options())
    reference = Reference(sizes, batch_size, RULES[rule](len(sizes)), seed, within, options())
    for step, (feed, feed_seed) in enumerate(plan):
        if step == reload_at:
            other = MixtureSampler(sizes, batch_size=batch_size, rule=RULES[rule](len(sizes)), seed=seed,
                                   within=within, prioritized=options())
            for _ in range(3):
                drawn = other.next_batch()
                other.feedback(drawn, loss=np.linspace(0.5, 2.5, batch_size))
            other.load_state_dict(sampler.state_dict())
            sampler = other
        batch = sampler.next_batch()
        indices, sources, weights = reference.next_batch()
        np.testing.assert_array_equal(batch.indices, indices)
        np.testing.assert_array_equal(batch.sources, sources)
        np.testing.assert_array_equal(batch.mixture, weights)
        if feed:
            pick = np.random.default_rng(feed_seed)
            chosen = indices[pick.integers(0, batch_size, size=pick.integers(1, 2 * batch_size + 1))]
            losses = pick.uniform(0.0, 3.0, size=len(chosen))
            sampler.feedback(chosen, loss=losses)
            reference.feedback(chosen, losses)
    stats = sampler.stats()
    np.testing.assert_array_equal(stats["drawn"], reference.drawn)
    np.testing.assert_array_equal(stats["fed_back"], reference.fed_back)
    assert_state_equal(sampler.rule.state_dict(), reference.rule.state_dict())
    for mine, theirs in zip(sampler.samplers, reference.samplers):
        assert_state_equal(mine.state_dict(), theirs.state_dict())
