"""Checkpoint: save, load into a fresh buffer/loader, continue -> identical to an uninterrupted run."""
import numpy as np
import pytest

from replayloader import ReplayBuffer, ReplayDataLoader, load_state, save_state
from replayloader.strategies import by_name

from .helpers import assert_state_equal


def make(name):
    return ReplayBuffer(64, alpha=0.7, beta=0.5, strategy=by_name(name), seed=123)


def run(buf, steps, start):
    rng = np.random.default_rng(start)
    out = []
    for step in range(start, start + steps):
        buf.add({"input_ids": rng.integers(0, 100, (16, 8)), "y": rng.random(16).astype(np.float32)})
        s = buf.sample(16)
        buf.feedback(s.ids, loss=rng.random(16))
        out.append((s.ids.copy(), s.probabilities.copy(), s.weights.copy(), s.data["input_ids"].copy()))
    return out


@pytest.mark.parametrize("name", ["loss_diff", "lsr", "linucb", "none"])
def test_resume_gives_identical_samples(name, tmp_path):
    straight = make(name)
    first = run(straight, 10, 0)
    save_state(straight.state_dict(), tmp_path / "buf.npz")
    tail = run(straight, 10, 10)

    resumed = make(name)
    resumed.load_state_dict(load_state(tmp_path / "buf.npz"))
    again = run(resumed, 10, 10)
    assert len(first) == 10
    for a, b in zip(tail, again):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    assert_state_equal(straight.state_dict(), resumed.state_dict())


def test_checkpoint_with_different_config_is_rejected():
    buf = make("loss_diff")
    run(buf, 2, 0)
    other = ReplayBuffer(64, alpha=0.5, beta=0.5, strategy=by_name("loss_diff"), seed=123)
    with pytest.raises(ValueError, match="alpha"):
        other.load_state_dict(buf.state_dict())


def test_torch_storage_roundtrip(tmp_path):
    torch = pytest.importorskip("torch")
    buf = ReplayBuffer(8, seed=0)
    buf.add({"x": torch.arange(12).reshape(6, 2)})
    save_state(buf.state_dict(), tmp_path / "t.npz")
    fresh = ReplayBuffer(8, seed=0)
    fresh.load_state_dict(load_state(tmp_path / "t.npz"))
    s1, s2 = buf.sample(5), fresh.sample(5)
    assert isinstance(s2.data["x"], torch.Tensor)
    assert torch.equal(s1.data["x"], s2.data["x"])


def test_loader_resume_continues_exactly():
    def make_loader():
        rng = np.random.default_rng(7)
        source = [rng.integers(0, 50, (8, 4)) for _ in range(12)]
        buf = ReplayBuffer(32, strategy=by_name("loss_diff"), seed=3)
        return ReplayDataLoader(lambda x: ({"input_ids": x}, x.sum()), buf, batch_size=8, source=source)

    def consume(batches, loader, n):
        out = []
        for batch in batches:
            loader.feedback(batch, loss=batch.data["input_ids"].mean(1) / 50)
            out.append(batch.ids)
            if len(out) == n:
                break
        return out

    straight = make_loader()
    batches = iter(straight)
    consume(batches, straight, 5)
    state = straight.state_dict()
    rest = consume(batches, straight, 100)
    resumed = make_loader()
    resumed.load_state_dict(state)
    again = consume(iter(resumed), resumed, 100)
    assert len(rest) == 7
    for a, b in zip(rest, again):
        np.testing.assert_array_equal(a, b)


def test_state_dict_is_a_snapshot_not_a_view():
    buf = make("linucb")
    run(buf, 3, 0)
    state = buf.state_dict()
    import copy

    frozen = copy.deepcopy(state)
    run(buf, 3, 3)
    assert_state_equal(state, frozen)


class RunningTotal:
    """A stateful producer: each batch carries the running total of everything produced before it."""

    def __init__(self) -> None:
        self.total = 0

    def __call__(self, x):
        out = {"input_ids": x, "before": np.full(len(x), self.total)}
        self.total += int(x.sum())
        return out

    def loader_state_dict(self) -> dict:
        return {"total": self.total}

    def load_loader_state_dict(self, state: dict) -> None:
        if not isinstance(state.get("total"), int):
            raise ValueError(f"total must be an int, got {state.get('total')!r}")
        self.total = state["total"]


def stateful_loader(producer, capacity: int = 32) -> ReplayDataLoader:
    rng = np.random.default_rng(7)
    source = [rng.integers(0, 50, (8, 4)) for _ in range(10)]
    return ReplayDataLoader(producer, ReplayBuffer(capacity, seed=3), batch_size=8, source=source)


def test_a_stateful_producer_is_saved_with_the_loader_and_resumes_exactly(tmp_path):
    straight = stateful_loader(RunningTotal())
    batches = iter(straight)
    [next(batches) for _ in range(4)]
    save_state(straight.state_dict(), tmp_path / "loader.npz")
    rest = [b.data["before"].copy() for b in batches]
    resumed = stateful_loader(RunningTotal())
    resumed.load_state_dict(load_state(tmp_path / "loader.npz"))
    again = [b.data["before"].copy() for b in resumed]
    assert len(rest) == 6 and rest[0][0] > 0  # the total carried over the resume, not restarted at 0
    for a, b in zip(rest, again):
        np.testing.assert_array_equal(a, b)


def test_a_stateful_producer_state_is_all_or_nothing_and_must_match():
    loader = stateful_loader(RunningTotal())
    batches = iter(loader)
    [next(batches) for _ in range(2)]
    state = loader.state_dict()
    other = stateful_loader(RunningTotal(), capacity=16)
    other.producer.total = 5
    before = other.state_dict()
    with pytest.raises(ValueError, match="capacity"):  # the buffer refuses: the producer gets its state back
        other.load_state_dict(state)
    assert other.producer.total == 5
    assert_state_equal(other.state_dict(), before)
    with pytest.raises(ValueError, match="total must be an int"):
        stateful_loader(RunningTotal()).load_state_dict({**state, "producer": {"total": "3"}})
    plain = stateful_loader(lambda x: {"input_ids": x, "before": x[:, 0]})
    with pytest.raises(ValueError, match="keeps no state"):
        plain.load_state_dict(state)
    with pytest.raises(ValueError, match="has none for it"):
        stateful_loader(RunningTotal()).load_state_dict(plain.state_dict())
    with pytest.raises(ValueError, match="runs inline"):
        ReplayDataLoader(RunningTotal(), ReplayBuffer(32), batch_size=8, steps=3, workers=1)
