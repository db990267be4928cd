"""Issue 43, the other loading paths: the one-file state of a distributed job (`read_state_file`, behind
`load_shared_state` and `ReplayShard.load_state`) and `load_state` refuse every truncation and byte flip in the
library's own error naming the file, or load exactly what was saved (a flip in a zip field nothing reads);
numpy's and zipfile's exceptions never reach the caller, and a refused file leaves no open file handle behind.
The ELECTRA integration's held-out set file is held to the same rule."""
import gc
import json
import warnings

import numpy as np
import pytest

from replayloader import InvalidState, StateFileError
from replayloader.distributed.replay_shard import ReplayShard
from replayloader.distributed.state_files import read_state_file, state_digest, write_state_file
from replayloader.state import load_state, save_state

STATE = {"weights": np.arange(40, dtype=np.float64) / 7, "cursor": 11, "nested": {"ids": np.arange(9)}}


def damaged_copies(good: bytes):
    """Every 7th truncation point (the empty file included) and 8 bytes flipped at every 5th position."""
    for cut in range(0, len(good), 7):
        yield f"truncated at {cut}", good[:cut]
    for at in range(0, len(good) - 8, 5):
        data = bytearray(good)
        data[at:at + 8] = bytes(b ^ 0xFF for b in data[at:at + 8])
        yield f"flipped at {at}", bytes(data)


def same(a, b):
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


@pytest.mark.parametrize("write, read", [
    (lambda path: write_state_file(STATE, state_digest(STATE), path), lambda path: read_state_file(path)[0]),
    (lambda path: save_state(STATE, path), load_state),
], ids=["shared state file", "save_state"])
def test_every_truncation_and_byte_flip_is_refused_by_name_or_harmless(tmp_path, write, read):
    path = tmp_path / "state.npz"
    write(path)
    good = path.read_bytes()
    refused = harmless = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for what, data in damaged_copies(good):
            path.write_bytes(data)
            try:
                loaded = read(path)
            except StateFileError as err:
                assert str(err).startswith(str(path)) and "\n" not in str(err), what
                refused += 1
            else:  # e.g. a flipped timestamp in a zip header: then the content is exactly what was saved
                assert same(loaded, STATE), what
                harmless += 1
        gc.collect()
    assert refused > 300 and harmless < refused / 5
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]  # no handle left open


def test_a_shard_file_without_its_world_size_is_refused_naming_the_file(tmp_path):
    shard = ReplayShard(0, 1)
    path = shard.file(tmp_path, ".npz")
    other = {"cursor": 3}  # a valid shared state file of another kind, where a shard belongs
    write_state_file(other, state_digest(other), path)
    with pytest.raises(InvalidState, match=f"{path}.*'world_size'"):
        shard.load_state(tmp_path)
    shard.save_state({"cursor": 3}, tmp_path)
    assert shard.load_state(tmp_path) == {"cursor": 3}


def test_a_held_out_set_file_is_written_atomically_digested_and_refused_by_name_when_damaged(tmp_path):
    """The ELECTRA integration's held-out set (`--heldout`): every truncation and byte flip is a `UserError`
    naming the file, or loads exactly what was saved; a file written before the digest still loads."""
    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    pytest.importorskip("transformers")
    from replayloader_electra.errors import UserError
    from replayloader_electra.pretrain.heldout import HeldoutSet

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 90, (6, 8), generator=generator)
    tensors = {"input_ids": ids, "original_ids": ids.flip(0), "attention_mask": torch.ones(6, 8, dtype=torch.long),
               "masked": torch.rand(6, 8, generator=generator) < 0.15}
    made = HeldoutSet(tensors, {"seed": 0, "tokenizer_digest": "abc"})
    path = tmp_path / "heldout.safetensors"
    made.save(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heldout.safetensors"]  # no temporary file left

    def same_set(loaded):
        return loaded.info == made.info and all(torch.equal(loaded.tensors[k], tensors[k]) for k in tensors)

    assert same_set(HeldoutSet.load(path))
    good = path.read_bytes()
    refused = 0
    for what, data in damaged_copies(good):
        path.write_bytes(data)
        try:
            loaded = HeldoutSet.load(path)
        except UserError as err:
            assert str(err).startswith(f"--heldout: {path}") and "\n" not in str(err), what
            refused += 1
        else:
            assert same_set(loaded), what
    assert refused == len(list(damaged_copies(good)))  # a safetensors file has no field nothing reads
    data = bytearray(good)
    data[-20] ^= 0xFF  # one byte of the last tensor: only the digest can tell
    path.write_bytes(bytes(data))
    with pytest.raises(UserError, match="do not match their recorded sha256"):
        HeldoutSet.load(path)
    safetensors_torch.save_file(tensors, str(path), metadata={"format": "1", "info": json.dumps(made.info)})
    assert same_set(HeldoutSet.load(path))  # the layout before the digest
