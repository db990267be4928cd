"""RayReplayLoader on a local Ray cluster: producer actors feed a buffer actor in item order under the rate
limiter (bounds hold, timeouts name the side), dead producers are reported or restarted without loss, and a
killed buffer actor or a restarted learner resumes from a checkpoint of every shard with exactly the contents of
an uninterrupted run (deterministic producers)."""
import os
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from replayloader import RateLimitTimeout, ReplayBuffer, WorkerError, load_state, save_state
from replayloader.loader import LimiterConfigError, RateLimiter  # noqa: E402
from replayloader.strategies import by_name  # noqa: E402
from replayloader.ray import BufferActorDied, ProducerDied, RayReplayLoader, RemoteBuffer, ShardedBuffer  # noqa: E402
from tests.core.helpers import assert_state_equal  # noqa: E402

ROWS = 8  # examples per produced batch


def produced(item):
    """What producer actors return for an item: a batch and its Ape-X priorities, a function of the item only."""
    rng = np.random.default_rng(item)
    return {"obs": rng.normal(size=(ROWS, 3)).astype(np.float32), "item": np.full(ROWS, item)}, rng.random(ROWS)


@ray.remote
class Producer:
    def __init__(self, die_at=None, delay=0.0):
        self.die_at, self.delay = die_at, delay

    def produce(self, item):
        if item == self.die_at:
            os._exit(1)  # the actor's process dies, as on a lost node
        time.sleep(self.delay)
        return produced(item)


def buffer_args(seed=0):
    return dict(capacity=200, alpha=0.6, beta=0.4, strategy=by_name("per"), seed=seed)


def reference(items, shards=1):
    """In-process buffers fed the items in order, shard i % shards; what the actor-backed ones must hold."""
    buffers = [ReplayBuffer(**buffer_args(seed=s)) for s in range(shards)]
    for item in items:
        batch, weight = produced(item)
        buffer = buffers[item % shards]
        buffer.feedback(buffer.add(batch), weight=weight)
    return buffers


def assert_same_contents(states, buffers):
    for state, buffer in zip(states, buffers):
        expected = buffer.state_dict()
        for key in ("storage", "weights", "slot_serial", "size", "next_serial"):
            assert_state_equal(state[key], expected[key], path=key)


@pytest.fixture(scope="module")
def producers(ray_cluster):
    actors = [Producer.remote() for _ in range(2)]
    yield actors
    for actor in actors:
        ray.kill(actor)


def test_rate_limiter_holds_across_producer_actors(producers):
    buffer = RemoteBuffer(**buffer_args())
    limiter = RateLimiter(samples_per_insert=2.0, min_size=16, error_buffer=24, timeout=30)
    loader = RayReplayLoader(producers, buffer, 16, source=range(24), rate_limiter=limiter)
    batches = 0
    for batch in loader:
        batches += 1
        assert batch.data["obs"].shape == (16, 3) and batch.fresh.shape == (16,)
        loader.feedback(batch, weight=np.abs(batch.data["obs"]).mean(axis=1))
    counts = limiter.stats()
    assert counts["inserts"] == 24 * ROWS and counts["samples"] == 16 * batches
    assert limiter.min_diff <= counts["diff_min"] and counts["diff_max"] <= limiter.max_diff
    assert 2.0 - 24 / (24 * ROWS) <= counts["samples_per_insert"] <= 2.0  # within the error buffer of the target
    state = buffer.state_dict()
    local = reference(range(24))[0].state_dict()
    assert_state_equal(state["storage"], local["storage"])  # item order, whichever actor finished first
    buffer.kill()


def test_timeouts_name_the_side(producers):
    buffer = RemoteBuffer(**buffer_args())
    slow = [Producer.remote(delay=1.5)]
    loader = RayReplayLoader(slow, buffer, 8, source=range(4),
                             rate_limiter=RateLimiter(1.0, min_size=8, error_buffer=8, timeout=0.5))
    with pytest.raises(RateLimitTimeout, match="the learner waited"):
        next(iter(loader))
    limiter = RateLimiter(1.0, min_size=8, error_buffer=8, timeout=30.0)
    limiter.insert_timeout = 1.0  # producers give up first, however slowly the machine serves the first batch
    loader = RayReplayLoader(producers, buffer, 8, source=range(40), rate_limiter=limiter)
    batches = iter(loader)
    next(batches)
    time.sleep(2.0)  # the learner stalls: producers wait past their timeout
    with pytest.raises(WorkerError, match="a producer waited"):
        for _ in batches:
            pass
    ray.kill(slow[0])
    buffer.kill()


def test_an_error_buffer_too_small_for_the_produced_batches_is_refused_as_itself(producers):
    """The pass `ReplayDataLoader` runs with workers (`loader.pacing`): a limiter that could block both sides
    forever is the caller's setting, raised as the `LimiterConfigError` it is, not as a producer failure."""
    buffer = RemoteBuffer(**buffer_args())
    tight = RateLimiter(1.0, min_size=4, error_buffer=7.0, timeout=5)  # 8 per insert + 8 per sample needs 8
    loader = RayReplayLoader(producers, buffer, 8, source=range(4), rate_limiter=tight)
    with pytest.raises(LimiterConfigError, match=r"error_buffer=7 is too small for inserts of 8 and samples of 8"):
        list(loader)
    buffer.kill()


def test_the_loader_takes_a_buffer_by_its_methods(producers):
    """`StagingBufferLike` (stage, commit, and `BufferLike`'s sample, feedback, checkpoints, len) is what the loader
    checks: both Ray buffers qualify, a local `ReplayBuffer` (no staging) is refused naming the protocol."""
    from replayloader.ray import StagingBufferLike

    buffer = RemoteBuffer(**buffer_args())
    assert isinstance(buffer, StagingBufferLike) and isinstance(ShardedBuffer([buffer]), StagingBufferLike)
    with pytest.raises(TypeError, match="buffer must be a RemoteBuffer, a ShardedBuffer or another StagingBufferLike"):
        RayReplayLoader(producers, ReplayBuffer(**buffer_args()), 8, steps=1)
    buffer.kill()


def test_dead_producer_is_reported_or_restarted_without_loss(producers):
    buffer = RemoteBuffer(**buffer_args())
    empty = buffer.state_dict()
    doomed = [Producer.remote(die_at=5), producers[1]]
    with pytest.raises(ProducerDied, match="producer 0 died while producing item 5"):
        for _ in RayReplayLoader(doomed, buffer, 8, source=range(12)):
            pass
    buffer.load_state_dict(empty)
    doomed[0] = Producer.remote(die_at=5)
    loader = RayReplayLoader(doomed, buffer, 8, source=range(12), restart=lambda i: Producer.remote())
    with pytest.warns(RuntimeWarning, match="producer 0 died while producing item 5"):
        batches = sum(1 for _ in loader)
    assert batches == 12 and [r["item"] for r in loader.restarts] == [5]
    assert loader.stats()["producer_restarts"] == 1
    assert_same_contents([buffer.state_dict()], reference(range(12)))  # every item, in order, Ape-X weights
    ray.kill(loader.producers[0])
    buffer.kill()


def test_killed_buffer_actor_resumes_from_its_checkpoint(producers):
    buffer = RemoteBuffer(**buffer_args())
    limiter = RateLimiter(samples_per_insert=1.0, min_size=8, error_buffer=16, timeout=30)
    loader = RayReplayLoader(producers, buffer, 8, source=range(30), rate_limiter=limiter)
    # the buffer actor dies mid-run: the learner's next call fails with the library's error, naming the recovery
    with pytest.raises(BufferActorDied, match=r"RemoteBuffer actor .* died.*buffer\.restart\(") as died:
        for step, _ in enumerate(loader):
            if step == 5:
                checkpoint = loader.state_dict()
            if step == 8:
                buffer.kill()
    assert isinstance(died.value.__cause__, ray.exceptions.RayActorError)  # Ray's own error stays the cause
    assert 0 < checkpoint["step"] < 30
    buffer.restart()
    loader.load_state_dict(checkpoint)
    for _ in loader:
        pass
    assert limiter.stats()["inserts"] == 30 * ROWS
    assert_same_contents([buffer.state_dict()], reference(range(30)))
    buffer.kill()


def test_restarted_learner_resumes_every_shard_from_a_checkpoint_file(producers, tmp_path):
    shards = ShardedBuffer([RemoteBuffer(**buffer_args(seed=s)) for s in range(2)], seed=0)
    empty = shards.state_dict()
    loader = RayReplayLoader(producers, shards, 8, source=range(30), replay_ratio=0.5)
    for step, _ in enumerate(loader):
        if step == 6:
            save_state(loader.state_dict(), tmp_path / "learner")
            break
    shards.load_state_dict(empty)  # a new learner process, whose shards start empty
    shards = ShardedBuffer(shards.shards, seed=0)
    loader = RayReplayLoader(producers, shards, 8, source=range(30), replay_ratio=0.5)
    loader.load_state_dict(load_state(tmp_path / "learner"))
    for batch in loader:
        assert loader.feedback(batch, weight=np.ones(8)) >= 0
    states = shards.state_dict()["shards"]
    contents = [{key: state[key] for key in ("storage", "slot_serial", "size", "next_serial")}
                for state in (states["0"], states["1"])]
    for state, local in zip(contents, reference(range(30), shards=2)):
        for key, value in state.items():
            assert_state_equal(value, local.state_dict()[key], path=key)
    for shard in shards.shards:
        shard.kill()


@pytest.mark.parametrize("bad", [{"step": -1}, {"credit": float("nan")}, {"rate_limiter": {"inserts": "many"}}])
def test_a_refused_checkpoint_changes_nothing(producers, bad):
    """The position and the limiter's state are checked before any shard is restored (before, a bad step was
    read only after the buffer had already been overwritten)."""
    from replayloader.state.checks import InvalidState

    buffer = RemoteBuffer(**buffer_args())
    limiter = RateLimiter(samples_per_insert=1.0, min_size=8, error_buffer=16, timeout=30)
    loader = RayReplayLoader(producers, buffer, 8, source=range(6), rate_limiter=limiter)
    for _ in loader:
        pass
    checkpoint = loader.state_dict()
    fresh = RemoteBuffer(**buffer_args())
    before = fresh.state_dict()
    other = RayReplayLoader(producers, fresh, 8, source=range(6),
                            rate_limiter=RateLimiter(samples_per_insert=1.0, min_size=8, error_buffer=16, timeout=30))
    with pytest.raises(InvalidState):
        other.load_state_dict({**checkpoint, **bad})
    assert other.step == 0 and other.rate_limiter.stats()["inserts"] == 0
    assert_same_contents([fresh.state_dict()], [ReplayBuffer(**buffer_args())])
    assert before["size"] == 0
    buffer.kill()
    fresh.kill()
