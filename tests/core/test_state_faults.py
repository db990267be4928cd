"""Fault injection on state files and state dicts: a damaged state is refused with a clear error and the object
it was offered to is unchanged; a save interrupted by kill -9 or a full disk leaves the previous file loadable.

Each case the issue reported (size beyond capacity, NaN weights, garbled serials, a removed key, a shortened
field, a truncated save...) is a test of its own; hypothesis then edits random fields and random bytes.
"""
from __future__ import annotations

import copy
import os
import random
import signal
import subprocess
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from replayloader import PrioritizedSampler, ReplayBuffer, ReplayDataLoader, load_state, save_state
from replayloader.state.files import StateFileError
from replayloader.state.checks import InvalidState
from replayloader.strategies import Initializer, LossDifference, MeanWeight, EvictLowest, Strategy, by_name

from .helpers import assert_state_equal

VARIANTS = ("loss_diff", "per", "linucb", "grad_norm")


def filled_buffer(name: str = "loss_diff", capacity: int = 64, seed: int = 0) -> ReplayBuffer:
    """A full buffer that has evicted, sampled and taken feedback, so every state field is non-trivial."""
    rng = np.random.default_rng(seed)
    beta = 0.4 if name == "per" else None
    buffer = ReplayBuffer(capacity, alpha=0.7, beta=beta, strategy=by_name(name), seed=seed)
    key = {"per": "weight", "grad_norm": "grad_norm"}.get(name, "loss")
    for _ in range(6):
        buffer.add({"input_ids": rng.integers(0, 50, (20, 5)), "x": rng.normal(size=(20, 3)).astype(np.float32)})
        sample = buffer.sample(16)
        buffer.feedback(sample.ids, **{key: rng.random(16)})
    return buffer


def assert_refused_unchanged(obj, state, match: str | None = None) -> None:
    before = obj.state_dict()
    with pytest.raises(InvalidState, match=match):
        obj.load_state_dict(state)
    assert_state_equal(before, obj.state_dict())


def assert_usable(buffer: ReplayBuffer) -> None:
    """A buffer that accepted a state works: sample, feedback and add run, and the tree matches the weights."""
    sample = buffer.sample(8)
    assert ((sample.ids % buffer.capacity) < len(buffer)).all()
    key = buffer.strategy.update.feedback_key or "loss"
    buffer.feedback(sample.ids, **{key: np.ones(8)})
    live = buffer.weights[: len(buffer)]
    np.testing.assert_allclose(buffer.tree.total, (live ** buffer.alpha).sum(), rtol=1e-9)
    batch = buffer.storage.gather(np.arange(4))
    buffer.add(batch)
    buffer.sample(4)


# ---------------------------------------------------------------- the reported cases, one test each
@pytest.mark.parametrize("size", [1000, 65, -1])
def test_size_beyond_capacity_or_negative_is_refused(size):
    buffer = filled_buffer()
    state = buffer.state_dict()
    state["size"] = size
    assert_refused_unchanged(buffer, state, "size")


@pytest.mark.parametrize("bad", [np.nan, -1.0, np.inf])
def test_invalid_weights_are_refused(bad):
    buffer = filled_buffer()
    state = buffer.state_dict()
    state["weights"][7] = bad
    assert_refused_unchanged(buffer, state, r"weights'\]\[7\]")


def test_next_serial_below_the_issued_serials_is_refused():
    buffer = filled_buffer()
    state = buffer.state_dict()
    state["next_serial"] = 0
    assert_refused_unchanged(buffer, state, "next_serial")


@pytest.mark.parametrize("edit", ["duplicate", "too_large", "negative", "empty_slot"])
def test_garbled_slot_serials_are_refused(edit):
    buffer = ReplayBuffer(64, seed=0)
    buffer.add({"x": np.zeros((40, 2))})  # not full: slots 40..63 are empty
    state = buffer.state_dict()
    serial = state["slot_serial"]
    if edit == "duplicate":
        serial[3] = serial[4]
    elif edit == "too_large":
        serial[3] = state["next_serial"]
    elif edit == "negative":
        serial[3] = -5
    else:
        serial[50] = 2
    assert_refused_unchanged(buffer, state, "slot_serial")


@pytest.mark.parametrize("key", ["counters", "strategy", "storage", "weights", "rng", "config", "last_add_slots"])
def test_a_removed_key_is_refused_and_nothing_changes(key):
    buffer = filled_buffer()
    state = buffer.state_dict()
    del state[key]
    assert_refused_unchanged(buffer, state, key)


@pytest.mark.parametrize("key", ["weights", "visits", "slot_serial", "added_at_call"])
def test_a_field_shortened_to_ten_rows_is_refused(key):
    buffer = filled_buffer()
    state = buffer.state_dict()
    state[key] = state[key][:10]
    assert_refused_unchanged(buffer, state, key)


def test_a_shortened_storage_field_is_refused_and_the_data_survives():
    buffer = filled_buffer()
    data_before = buffer.storage.gather(np.arange(len(buffer)))
    state = buffer.state_dict()
    state["storage"]["fields"]["x"] = state["storage"]["fields"]["x"][:10]
    assert_refused_unchanged(buffer, state, "'x'")
    np.testing.assert_array_equal(buffer.sample(4).data["x"].shape, (4, 3))
    for name, value in buffer.storage.gather(np.arange(len(buffer))).items():
        np.testing.assert_array_equal(value, data_before[name])


def test_storage_of_another_dtype_is_refused():
    buffer = filled_buffer()
    state = buffer.state_dict()
    state["storage"]["fields"]["x"] = state["storage"]["fields"]["x"].astype(np.float64)
    assert_refused_unchanged(buffer, state, "dtype")


def test_an_all_zero_rng_state_is_refused():
    buffer = filled_buffer()
    state = buffer.state_dict()
    state["rng"] = np.zeros(4, np.uint64)
    assert_refused_unchanged(buffer, state, "RNG")


def test_a_fifo_position_beyond_capacity_is_refused():
    buffer = filled_buffer("per")
    state = buffer.state_dict()
    state["strategy"]["evict"]["next_slot"] = 64
    assert_refused_unchanged(buffer, state, "next_slot")


def test_a_loss_memory_of_the_wrong_length_is_refused():
    buffer = filled_buffer()
    state = buffer.state_dict()
    state["strategy"]["update"]["last_loss"] = np.zeros(10)
    assert_refused_unchanged(buffer, state, "last_loss")


def test_a_strategy_part_that_refuses_rolls_back_the_parts_already_loaded():
    class Fussy(Initializer):
        """Loads a counter, then refuses anything odd (after having assigned: the worst case)."""

        name = "fussy"

        def __init__(self):
            self.counter = 0

        def constant_weight(self, view):
            return 1.0

        def state_dict(self):
            return {"counter": self.counter}

        def load_state_dict(self, state):
            self.counter = state["counter"]
            if self.counter % 2:
                raise ValueError("odd counter")

    strategy = Strategy(Fussy(), LossDifference(), EvictLowest())
    buffer = ReplayBuffer(32, strategy=strategy, seed=0)
    buffer.add({"x": np.zeros((40, 1))[:32]})
    buffer.feedback(buffer.sample(8).ids, loss=np.ones(8))
    buffer.feedback(buffer.sample(8).ids, loss=np.full(8, 2.0))
    state = buffer.state_dict()
    state["strategy"]["init"]["counter"] = 3
    before = buffer.state_dict()
    with pytest.raises(ValueError, match="odd counter"):
        buffer.load_state_dict(state)
    assert_state_equal(before, buffer.state_dict())


def test_sampler_weights_of_length_ten_are_refused_and_the_rng_kept():
    sampler = PrioritizedSampler(100, 10, seed=0, warmup_epochs=1)
    for _ in range(12):
        batch = sampler.next_batch()
        sampler.feedback(batch, loss=np.random.default_rng(0).random(len(batch)))
    state = sampler.state_dict()
    state["weights"] = state["weights"][:10]
    assert_refused_unchanged(sampler, state, "weights")
    expected = copy.deepcopy(sampler).next_batch().indices
    np.testing.assert_array_equal(sampler.next_batch().indices, expected)


@pytest.mark.parametrize("edit", ["order", "position", "last_drawn_epoch", "rng", "counters"])
def test_sampler_inconsistent_fields_are_refused(edit):
    sampler = PrioritizedSampler(50, 8, seed=0, warmup_epochs=2)
    for _ in range(3):
        sampler.next_batch()  # mid warm-up: the permutation is live
    state = sampler.state_dict()
    if edit == "order":
        state["order"][0] = state["order"][1]
    elif edit == "position":
        state["position"] = 7
    elif edit == "last_drawn_epoch":
        state["last_drawn_epoch"][0] = 5
    elif edit == "rng":
        state["rng"] = np.zeros(4, np.uint64)
    else:
        state["counters"]["drawn"] = -1
    assert_refused_unchanged(sampler, state)


def test_loader_restores_the_source_when_the_buffer_refuses():
    class Counter:
        def __init__(self):
            self.i = 0

        def __iter__(self):
            return self

        def __next__(self):
            self.i += 1
            return self.i

        def state_dict(self):
            return {"i": self.i}

        def load_state_dict(self, state):
            self.i = state["i"]

    source = Counter()
    loader = ReplayDataLoader(lambda item: {"x": np.full((4, 1), item)}, ReplayBuffer(16, seed=0),
                              batch_size=4, steps=5, source=source)
    for batch in loader:
        loader.feedback(batch, loss=np.ones(4))
    state = loader.state_dict()
    state["source"] = {"i": 100}
    state["buffer"]["size"] = 99
    before = (loader.step, loader.consumed, source.i)
    with pytest.raises(InvalidState, match="size"):
        loader.load_state_dict(state)
    assert (loader.step, loader.consumed, source.i) == before


# ---------------------------------------------------------------- random field edits (hypothesis)
def _leaves(node, path=()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, path + (key,))
    elif isinstance(node, list) and node and isinstance(node[0], dict):
        for i, value in enumerate(node):
            yield from _leaves(value, path + (i,))
    else:
        yield path


def _edit(value, how: int, rng: random.Random):
    """One kind of damage: a wrong shape, a bad number, a wrong type, a wrong dtype, or one changed element."""
    if isinstance(value, np.ndarray) and value.size:
        out = value.copy()
        flat = out.reshape(-1)
        i = rng.randrange(flat.size)
        choices = {0: lambda: value[: max(0, len(value) - 1 - rng.randrange(len(value)))],
                   1: lambda: value.astype(np.float32) if value.dtype != np.float32 else value.astype(np.float64),
                   2: lambda: None}
        if how in choices:
            return choices[how]()
        if out.dtype.kind == "f":
            flat[i] = [np.nan, -1.0, np.inf, 1e300, -0.0, 3.5][how % 6]
        elif out.dtype.kind in "iu":
            flat[i] = [-1, 2**62, 0, 1, 63, 64, 10**6][how % 7] if out.dtype.kind == "i" else 0
        elif out.dtype.kind == "b":
            flat[i] = not flat[i]
        return out
    return [None, -1, 2**62, 1.5, "x", True, [1, 2], {}, np.nan, 0][how % 10]


def _set(state, path, value):
    node = state
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value


def _load_damaged(obj, pick: int, how: int, delete: bool) -> bool:
    """Damage one random leaf of ``obj``'s state and load it: True if accepted; if refused, the error must be
    a `ValueError` (`InvalidState` or one naming the field) and ``obj`` unchanged."""
    state = obj.state_dict()
    paths = list(_leaves(state))
    path = paths[pick % len(paths)]
    node = state
    for key in path:
        node = node[key]
    _set(state, path, _DELETE if delete and not isinstance(path[-1], int) else _edit(node, how, random.Random(pick)))
    before = obj.state_dict()
    try:
        obj.load_state_dict(state)
    except ValueError as err:
        assert str(err)
        assert_state_equal(before, obj.state_dict())
        event(f"refused ({type(err).__name__})")
        return False
    event("accepted, and it works")
    return True


_DELETE = object()
# A longer run for results/state_faults/state_faults.md: STATE_FAULT_EXAMPLES=3000 (see that file for the command).
_EXAMPLES = int(os.environ.get("STATE_FAULT_EXAMPLES", "120"))
_FIELD_EDITS = settings(max_examples=_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_FIELD_EDITS
@given(name=st.sampled_from(VARIANTS), pick=st.integers(0, 10**6), how=st.integers(0, 30),
       delete=st.booleans(), seed=st.integers(0, 3))
def test_random_field_edits_are_refused_unchanged_or_leave_a_working_buffer(name, pick, how, delete, seed):
    buffer = filled_buffer(name, seed=seed)
    if _load_damaged(buffer, pick, how, delete):
        assert_usable(buffer)


@_FIELD_EDITS
@given(pick=st.integers(0, 10**6), how=st.integers(0, 30), delete=st.booleans())
def test_random_sampler_field_edits_are_refused_unchanged_or_accepted(pick, how, delete):
    sampler = PrioritizedSampler(60, 8, seed=1, warmup_epochs=1, update=LossDifference(), init=MeanWeight())
    rng = np.random.default_rng(pick % 7)
    for _ in range(10):
        batch = sampler.next_batch()
        sampler.feedback(batch, loss=rng.random(len(batch)))
    if _load_damaged(sampler, pick, how, delete):
        for _ in range(3):
            batch = sampler.next_batch()
            assert ((batch.indices >= 0) & (batch.indices < 60)).all()
            sampler.feedback(batch, loss=np.ones(len(batch)))


# ---------------------------------------------------------------- files: bytes, kills, full disks
@pytest.fixture(scope="module")
def saved_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("state") / "buffer.npz"
    state = filled_buffer("linucb").state_dict()
    save_state(state, path)
    return path, state


@settings(max_examples=max(150, _EXAMPLES), deadline=None)
@given(edits=st.lists(st.tuples(st.integers(0, 10**9), st.integers(1, 255)), min_size=1, max_size=4),
       truncate=st.one_of(st.none(), st.integers(0, 10**9)))
def test_random_byte_edits_are_detected_or_harmless(saved_file, tmp_path_factory, edits, truncate):
    path, state = saved_file
    data = bytearray(path.read_bytes())
    for offset, xor in edits:
        data[offset % len(data)] ^= xor
    if truncate is not None:
        data = data[: truncate % len(data)]
    damaged = tmp_path_factory.mktemp("damaged") / "buffer.npz"
    damaged.write_bytes(bytes(data))
    try:
        loaded = load_state(damaged)
    except StateFileError as err:
        assert str(damaged) in str(err)
        event("refused (StateFileError)")
    else:  # the edit hit bytes that carry nothing (zip padding, a timestamp): the content is intact
        assert_state_equal(state, loaded)
        event("loaded, content identical")


def test_a_missing_or_empty_file_is_named(tmp_path):
    with pytest.raises(StateFileError, match="no such file"):
        load_state(tmp_path / "absent.npz")
    (tmp_path / "empty.npz").write_bytes(b"")
    with pytest.raises(StateFileError, match="empty.npz"):
        load_state(tmp_path / "empty.npz")


def test_a_file_that_is_no_zip_archive_is_refused_in_the_librarys_words_not_numpys(tmp_path, saved_file):
    """Issue 43: a flipped first byte made np.load take the file for a pickle and advise allow_pickle."""
    path, _ = saved_file
    data = bytearray(path.read_bytes())
    data[:8] = bytes(b ^ 0xFF for b in data[:8])
    (tmp_path / "flipped.npz").write_bytes(bytes(data))
    np.save(tmp_path / "lone.npy", np.arange(3))
    for name, why in (("flipped.npz", "it does not start with a zip header"),
                      ("lone.npy", "it holds a single array, not a zip archive")):
        with pytest.raises(StateFileError) as refused:
            load_state(tmp_path / name)
        message = str(refused.value)
        assert message == f"{tmp_path / name}: not a readable state archive (truncated or damaged?): {why}"
        assert "pickle" not in message
    assert not issubclass(StateFileError, InvalidState) and issubclass(StateFileError, ValueError)  # docs/state.md


def test_the_two_file_format_of_earlier_versions_still_loads(tmp_path):
    import json

    from replayloader.state.files import flatten_state

    state = filled_buffer().state_dict()
    arrays, meta = flatten_state(state)
    np.savez(tmp_path / "old.npz", **arrays)
    (tmp_path / "old.npz.json").write_text(json.dumps(meta))
    assert_state_equal(state, load_state(tmp_path / "old.npz"))
    (tmp_path / "old.npz.json").write_text("{garbage")
    with pytest.raises(StateFileError, match="old.npz.json"):
        load_state(tmp_path / "old.npz")


def _saver_child(path, states) -> None:
    """In a forked child: save the given states over ``path`` in turn, forever (until killed)."""
    i = 0
    while True:
        save_state(states[i % len(states)], path)
        i += 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_kill_9_during_saves_always_leaves_a_loadable_previous_state(tmp_path):
    path = tmp_path / "buffer.npz"
    states = [filled_buffer("loss_diff", capacity=2048, seed=s).state_dict() for s in range(2)]
    save_state(states[0], path)
    rng = random.Random(0)
    for attempt in range(20):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child never returns
            try:
                _saver_child(path, states)
            finally:
                os._exit(1)
        time.sleep(rng.uniform(0.0, 0.15))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        loaded = load_state(path)
        matches = []
        for candidate in states:
            try:
                assert_state_equal(candidate, loaded)
                matches.append(True)
            except AssertionError:
                matches.append(False)
        assert any(matches), f"attempt {attempt}: the file holds neither saved state"
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "buffer.npz"]
    assert all(name.endswith(".tmp") for name in leftovers)  # a killed write may leave its temporary file


@pytest.fixture
def tiny_filesystem(tmp_path):
    """A 256 KiB tmpfs (root on Linux); skipped where mounting is not allowed."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)  # busy: detach it anyway


def test_a_full_disk_leaves_the_previous_state_and_no_temporary_file(tiny_filesystem):
    path = tiny_filesystem / "buffer.npz"
    small = filled_buffer(capacity=64).state_dict()
    save_state(small, path)
    large = filled_buffer(capacity=8192).state_dict()  # several hundred KiB: does not fit
    with pytest.raises(OSError):
        save_state(large, path)
    assert_state_equal(small, load_state(path))
    assert sorted(p.name for p in tiny_filesystem.iterdir()) == ["buffer.npz"]
