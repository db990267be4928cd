"""The mixture in a torch DataLoader: workers and pin_memory, feedback between batches, exact resume through a
2-worker DataLoader, rank slices, K datasets as one, K streams."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset, TensorDataset  # noqa: E402

from replayloader import InvalidState  # noqa: E402
from replayloader.distributed import fork_safe_context  # noqa: E402
from replayloader.mixing import ODM, FixedMixture, MixtureSampler  # noqa: E402
from replayloader.torch import MixtureBatchSampler, MixtureIterableDataset, concat_sources  # noqa: E402


class IndexDataset(Dataset):
    """Example i is its own index, so a batch shows which indices the workers were sent."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"index": torch.tensor(i), "x": torch.full((2,), float(i))}


def make(seed=0):
    return MixtureSampler([30, 20, 10], batch_size=6, rule=ODM(warmup_steps=0), seed=seed, names=["a", "b", "c"])


def loader_for(batches, workers):
    options = {"num_workers": workers, "prefetch_factor": 2,
               "multiprocessing_context": fork_safe_context(workers)} if workers else {}
    return DataLoader(IndexDataset(60), batch_sampler=batches, pin_memory=True, **options)


def train(batches, loader, epochs, stop_after=None):
    """Receive batches, check each one's info, feed back a loss; return the index lists received."""
    seen = []
    for _ in range(epochs):
        for batch in loader:
            info = batches.next_batch_info()
            np.testing.assert_array_equal(batch["index"].numpy(), info.indices)
            # the loss depends on the global step, not on this call's count, so a resumed run feeds back the same
            batches.feedback(info, loss=(batch["index"] % 5).float() + 0.1 * info.step)
            seen.append(info.indices.tolist())
            if stop_after is not None and len(seen) == stop_after:
                return seen
    return seen


def test_two_workers_with_pin_memory_give_the_no_worker_stream_without_feedback():
    streams = {}
    for workers in (0, 2):
        batches = MixtureBatchSampler(make())
        streams[workers] = [b["index"].tolist() for _ in range(2) for b in loader_for(batches, workers)]
    assert len(streams[0]) == 2 * 10 and streams[0] == streams[2]


@pytest.mark.parametrize("workers", [0, 2])
def test_feedback_through_a_dataloader_moves_the_weights(workers):
    batches = MixtureBatchSampler(make())
    seen = train(batches, loader_for(batches, workers), epochs=3)
    stats = batches.stats()
    assert len(seen) == 30 and stats["feedback_calls"] == 30 and stats["fed_back"].sum() == 180
    assert not np.allclose(stats["weights"], 1 / 3)


def test_with_workers_a_batch_is_drawn_prefetch_batches_ahead():
    """The lag the docs state: with 2 workers and prefetch_factor 2, 4 batches are drawn before the loop has
    received the first one."""
    batches = MixtureBatchSampler(make())
    iterator = iter(loader_for(batches, 2))
    next(iterator)
    assert batches.mixture.step >= 1 + 2 * 2
    del iterator


@pytest.mark.parametrize("stop", [3, 10, 14])
def test_resume_through_a_two_worker_dataloader_continues_identically(stop):
    batches = MixtureBatchSampler(make())
    uninterrupted = train(batches, loader_for(batches, 2), epochs=3)
    first = MixtureBatchSampler(make())
    loader = loader_for(first, 2)
    seen = train(first, loader, epochs=3, stop_after=stop)
    state = first.state_dict()  # batches drawn ahead by the workers are in it
    assert len(state["pending"]) > 0 or stop % len(first) == 0  # at a pass end nothing is drawn ahead yet
    del loader
    resumed = MixtureBatchSampler(make())
    resumed.load_state_dict(state)
    loader = loader_for(resumed, 2)
    rest = train(resumed, loader, epochs=3)
    assert (seen + rest)[:len(uninterrupted)] == uninterrupted


def test_len_is_num_batches_and_an_interrupted_pass_continues():
    batches = MixtureBatchSampler(make(), num_batches=4)
    assert len(DataLoader(IndexDataset(60), batch_sampler=batches)) == 4
    iterator = iter(batches)
    next(iterator), next(iterator)
    assert len(list(iter(batches))) == 2 and len(list(iter(batches))) == 4


def test_rank_slices_by_hand_concatenate_to_the_global_batch():
    one = MixtureBatchSampler(make())
    ranks = [MixtureBatchSampler(make(), rank=r, world_size=2) for r in range(2)]
    for whole, part0, part1 in zip(iter(one), *map(iter, ranks)):
        assert part0 + part1 == whole and len(part0) == 3
    with pytest.raises(ValueError, match="not divisible by the world size 4"):
        MixtureBatchSampler(make(), world_size=4)
    with pytest.raises(ValueError, match="rank"):
        MixtureBatchSampler(make(), rank=2, world_size=2)


def test_a_bad_batch_sampler_state_is_refused_and_changes_nothing():
    batches = MixtureBatchSampler(make())
    iterator = iter(batches)
    next(iterator), next(iterator)
    state = batches.state_dict()
    fresh = MixtureBatchSampler(make())
    before = fresh.mixture.state_dict()
    wrong = {**state["pending"][0], "sources": (state["pending"][0]["sources"] + 1) % 3}
    for bad, message in [({**state, "pending": [wrong]}, "the indices' sources"),
                         ({**state, "position": 11}, "position"),
                         ({**state, "mixture": {**state["mixture"], "step": -1}}, "step")]:
        with pytest.raises(InvalidState, match=message):
            fresh.load_state_dict(bad)
        assert repr(fresh.mixture.state_dict()) == repr(before)


def test_concat_sources_lays_the_datasets_out_as_the_sampler_expects():
    parts = [TensorDataset(torch.full((n,), float(k))) for k, n in enumerate((4, 7, 3))]
    data, sampler = concat_sources(parts, batch_size=5, rule=FixedMixture.stratified(3), seed=0)
    assert len(data) == sampler.num_examples == 14
    for _ in range(10):
        batch = sampler.next_batch()
        np.testing.assert_array_equal([int(data[i][0]) for i in batch.indices], batch.sources)
    with pytest.raises(ValueError, match="at least one"):
        concat_sources([], batch_size=2, rule=ODM())


# ----------------------------------------------------------------------------- streams
class Stream:
    """A re-iterable stream: source k yields k * 1000 + i for i < n."""

    def __init__(self, k, n):
        self.k, self.n = k, n

    def __iter__(self):
        return iter(range(self.k * 1000, self.k * 1000 + self.n))


def make_stream():
    return MixtureIterableDataset([Stream(0, 5), Stream(1, 8), Stream(2, 3)], batch_size=4, rule=ODM(warmup_steps=0), seed=2)


def stream_run(dataset, steps):
    out = []
    for batch, sources in DataLoader(dataset, batch_size=None, num_workers=0):
        np.testing.assert_array_equal(batch.numpy() // 1000, sources.numpy())
        dataset.feedback(sources, loss=(batch % 7).float())
        out.append(batch.tolist())
        if len(out) == steps:
            return out


def test_a_stream_mixture_reads_each_source_in_order_and_starts_it_over():
    dataset = make_stream()
    batches = stream_run(dataset, 30)
    flat = np.concatenate(batches)
    for k, n in enumerate((5, 8, 3)):
        mine = flat[flat // 1000 == k] - k * 1000
        np.testing.assert_array_equal(mine, np.arange(len(mine)) % n)
    stats = dataset.stats()
    assert stats["feedback_calls"] == 30 and stats["passes"].sum() > 0 and not np.allclose(stats["weights"], 1 / 3)


def test_a_stream_mixture_resumes_exactly():
    dataset = make_stream()
    stream_run(dataset, 7)
    state = dataset.state_dict()
    uninterrupted = stream_run(dataset, 12)
    resumed = make_stream()
    resumed.load_state_dict(state)
    assert stream_run(resumed, 12) == uninterrupted


def test_a_stream_mixture_refuses_workers_one_shot_iterators_and_bad_feedback():
    with pytest.raises(RuntimeError, match="num_workers=0"):
        next(iter(DataLoader(make_stream(), batch_size=None, num_workers=1,
                             multiprocessing_context=fork_safe_context(1) or "spawn")))
    with pytest.raises(TypeError, match=r"sources\[1\] must be re-iterable"):
        MixtureIterableDataset([[1, 2], iter([3, 4])], batch_size=2, rule=ODM())
    dataset = make_stream()
    before = repr(dataset.state_dict())
    with pytest.raises(ValueError, match=r"sources\[1\] = 3"):
        dataset.feedback(torch.tensor([0, 3]), loss=torch.ones(2))
    with pytest.raises(ValueError, match=r"loss\[0\] = nan"):
        dataset.feedback(torch.tensor([0, 1]), loss=torch.tensor([float("nan"), 1.0]))
    assert repr(dataset.state_dict()) == before
    empty = MixtureIterableDataset([[1], []], batch_size=8, rule=FixedMixture([0.5, 0.5]))
    with pytest.raises(ValueError, match="source 1 .* is empty"):
        empty.next_batch()
