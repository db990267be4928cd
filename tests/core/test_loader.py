"""ReplayDataLoader: producer/aux plumbing, replay ratio, fresh mask, feedback, no-replay baseline."""
import numpy as np
import pytest

from replayloader import ReplayBuffer, ReplayDataLoader
from replayloader.strategies import NoReplay, by_name


def counter_producer():
    state = {"n": 0}

    def produce():
        start = state["n"]
        state["n"] += 4
        return {"x": np.arange(start, start + 4)}, {"produced_from": start}

    return produce


def test_yields_ratio_batches_per_produce_with_aux():
    loader = ReplayDataLoader(counter_producer(), ReplayBuffer(16, seed=0), batch_size=4, replay_ratio=2,
                              steps=3)
    batches = list(loader)
    assert len(batches) == 6
    assert [b.aux["produced_from"] for b in batches] == [0, 0, 4, 4, 8, 8]
    assert [b.produced for b in batches] == [1, 1, 2, 2, 3, 3]
    for b in batches:
        np.testing.assert_array_equal(b.fresh, b.data["x"] >= b.aux["produced_from"])


def test_fractional_ratio_and_min_size():
    loader = ReplayDataLoader(counter_producer(), ReplayBuffer(16, seed=0), batch_size=2, replay_ratio=0.5,
                              steps=8, min_size=8)
    steps = [b.produced for b in loader]
    assert steps == [3, 5, 7]  # first yield once 8 examples are stored, then every other produce


def test_source_feeds_producer_and_feedback_reaches_strategy():
    source = [np.full((4, 2), i) for i in range(5)]
    buf = ReplayBuffer(8, strategy=by_name("loss"), seed=0)
    loader = ReplayDataLoader(lambda item: {"input_ids": item}, buf, batch_size=4, source=source)
    assert len(loader) == 5
    for batch in loader:
        loader.feedback(batch, loss=batch.data["input_ids"][:, 0].astype(float) + 0.5)
    live = buf.weights[: len(buf)]
    assert buf.stats()["updated"] > 0 and (live != 1.0).any()


def test_no_replay_loader_hands_back_what_was_produced():
    loader = ReplayDataLoader(counter_producer(), ReplayBuffer(8, strategy=NoReplay()), batch_size=4, steps=5)
    for i, batch in enumerate(loader):
        np.testing.assert_array_equal(batch.data["x"], np.arange(4 * i, 4 * i + 4))
        assert batch.fresh.all()


def test_bad_loader_arguments():
    buf = ReplayBuffer(8)
    with pytest.raises(ValueError, match="batch_size"):
        ReplayDataLoader(counter_producer(), buf, batch_size=0, steps=1)
    with pytest.raises(ValueError, match="replay_ratio"):
        ReplayDataLoader(counter_producer(), buf, batch_size=2, replay_ratio=0, steps=1)
    with pytest.raises(ValueError, match="source iterable or a number of steps"):
        ReplayDataLoader(counter_producer(), buf, batch_size=2)
    with pytest.raises(TypeError, match="producer must return"):
        list(ReplayDataLoader(lambda: [1, 2], buf, batch_size=2, steps=1))


def test_torch_dataloader_as_source():
    torch = pytest.importorskip("torch")
    data = torch.arange(64).reshape(32, 2)
    source = torch.utils.data.DataLoader(data, batch_size=8)
    buf = ReplayBuffer(16, strategy=by_name("loss_diff"), seed=0)
    loader = ReplayDataLoader(lambda x: ({"input_ids": x}, x.float().mean()), buf, batch_size=8, source=source)
    seen = 0
    for batch in loader:
        assert isinstance(batch.data["input_ids"], torch.Tensor)
        loader.feedback(batch, loss=batch.data["input_ids"].float().mean(1) / 64)
        seen += 1
    assert seen == len(source) == 4


def test_batches_report_sample_ages_in_adds():
    loader = ReplayDataLoader(counter_producer(), ReplayBuffer(64, seed=0), batch_size=4, steps=6)
    for batch in loader:
        # example x was produced by add number x // 4 (4 per produce), so its age is step - 1 - x // 4
        np.testing.assert_array_equal(batch.ages, batch.produced - 1 - batch.data["x"] // 4)
        assert (batch.ages == 0).tolist() == batch.fresh.tolist()


def test_the_loader_and_the_lock_take_any_fillable_buffer_by_its_methods_not_its_class():
    """`FillableBufferLike` (add, sample, feedback, stats, state_dict, load_state_dict, len, capacity) is what
    `LockedBuffer` and `ReplayDataLoader` check: a `LockedBuffer` itself qualifies, and runs as the buffer does."""
    from replayloader.buffer import FillableBufferLike, LockedBuffer

    locked = LockedBuffer(ReplayBuffer(16, seed=0))
    assert isinstance(locked, FillableBufferLike) and isinstance(LockedBuffer(locked).buffer, LockedBuffer)
    through_lock = list(ReplayDataLoader(counter_producer(), locked, batch_size=4, steps=3))
    direct = list(ReplayDataLoader(counter_producer(), ReplayBuffer(16, seed=0), batch_size=4, steps=3))
    for a, b in zip(through_lock, direct, strict=True):
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.fresh, b.fresh)
    for wrap in (LockedBuffer, lambda buffer: ReplayDataLoader(counter_producer(), buffer, batch_size=4, steps=1)):
        with pytest.raises(TypeError, match=r"buffer must be a ReplayBuffer or another FillableBufferLike .*got dict"):
            wrap({})
