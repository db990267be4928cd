"""ReplayShard: per-rank batch and capacity, seed streams, per-rank checkpoint files and the world-size check
(one process plays each rank; the ELECTRA integration's 2-rank runs in tests/electra use it under torchrun)."""
from __future__ import annotations

import numpy as np
import pytest

from replayloader import ReplayBuffer
from replayloader.state.files import StateFileError
from replayloader.distributed.replay_shard import ReplayShard
from replayloader.strategies import by_name


def filled_buffer(seed: int) -> ReplayBuffer:
    buffer = ReplayBuffer(16, strategy=by_name("loss_diff"), seed=seed)
    rng = np.random.default_rng(seed)
    for _ in range(3):
        ids = buffer.add({"x": rng.normal(size=(4, 3))})
        buffer.feedback(ids, loss=rng.random(4))
    return buffer


def test_one_process_keeps_everything_as_it_is():
    shard = ReplayShard()
    assert shard.seed(7) == 7 and shard.split(32, 1000) == (32, 1000)
    assert ReplayShard.current() == ReplayShard(0, 1)  # no process group running


def test_ranks_get_distinct_reproducible_seeds_and_an_even_split():
    seeds = [ReplayShard(rank, 4).seed(7) for rank in range(4)]
    assert len(set(seeds)) == 4 and seeds == [ReplayShard(rank, 4).seed(7) for rank in range(4)]
    assert all(0 <= s < 2 ** 63 for s in seeds) and ReplayShard(0, 4).seed(8) != seeds[0]
    assert ReplayShard(3, 4).split(32, 1001) == (8, 250)


@pytest.mark.parametrize("call, message", [
    (lambda: ReplayShard(0, 3).split(8, 100), r"batch_size 8 \(the global batch\) must be divisible by the number "
                                              r"of ranks 3"),
    (lambda: ReplayShard(0, 3).split(9, 2), r"capacity 2 must be at least the number of ranks 3"),
    (lambda: ReplayShard(2, 2), r"rank must be an integer in \[0, 1\] \(world_size is 2\), got 2"),
    (lambda: ReplayShard(0, 0), r"world_size must be an integer >= 1, got 0"),
])
def test_bad_configuration_is_a_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_each_rank_saves_and_resumes_its_own_shard(tmp_path):
    buffers = [filled_buffer(ReplayShard(rank, 2).seed(0)) for rank in range(2)]
    for rank, buffer in enumerate(buffers):
        ReplayShard(rank, 2).save_state(buffer.state_dict(), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank-00000.npz", "rank-00001.npz"]
    for rank, buffer in enumerate(buffers):
        restored = ReplayBuffer(16, strategy=by_name("loss_diff"))
        restored.load_state_dict(ReplayShard(rank, 2).load_state(tmp_path))
        expected, got = buffer.sample(8), restored.sample(8)
        assert np.array_equal(expected.ids, got.ids) and np.array_equal(expected.weights, got.weights)


@pytest.mark.parametrize("world_size, message", [
    (1, r"was written by 2 rank\(s\) but this run has 1.*2 processes in total"),
    (4, r"was written by 2 rank\(s\) but this run has 4.*2 processes in total"),
])
def test_resuming_on_another_world_size_is_a_clear_error(tmp_path, world_size, message):
    for rank in range(2):
        ReplayShard(rank, 2).save_state(filled_buffer(rank).state_dict(), tmp_path)
    for rank in (0, world_size - 1):
        with pytest.raises(ValueError, match=message):
            ReplayShard(rank, world_size).load_state(tmp_path)


def test_a_missing_shard_file_names_the_file(tmp_path):
    with pytest.raises(StateFileError, match=r"rank-00001\.npz: no such shard file"):
        ReplayShard(1, 2).load_state(tmp_path)
