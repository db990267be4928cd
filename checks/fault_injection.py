"""Randomized fault injection into pretraining checkpoints: many more cases than the unit tests, with counts.

Three parts, each writing one JSON line per trial to ``--out`` (JSONL) and a summary table to stdout:

- **corruptions**: a tiny real pretraining run (checkpoints at steps 2, 4, 6) is copied; the newest checkpoint
  of the copy gets one random fault (a file truncated at a random length, a random bit flipped, a file
  deleted, random bytes appended, state.json or a rank's JSON replaced by garbage or given a random edited
  field, the directory emptied). Expected: `choose_checkpoint` skips step 6 naming the damaged file and
  picks step 4, which then loads into a fresh model.
- **kills**: a child saves checkpoints back to back (prune keep 2) and is SIGKILLed at a random instant.
  Expected: every ``step-N`` directory left verifies and the newest loads with the values of its step.
- **full disk**: saves into a tmpfs too small for two checkpoints (mounted here when permitted, else
  skipped and said so). Expected: `CheckpointNotWritten` naming the intact previous checkpoint, no partial
  directory left.

    python -m checks.fault_injection --corruptions 200 --kills 200 --out results/checkpoint_faults/checkpoint_faults.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np  # noqa: E402
import torch  # noqa: E402

from replayloader_electra.errors import UserError  # noqa: E402
from replayloader_electra.data import prepare_pretraining_data  # noqa: E402
from replayloader_electra.pretrain import PretrainConfig, checkpoint, pretrain  # noqa: E402
from replayloader_electra.pretrain.config import model_preset  # noqa: E402
from replayloader_electra.models import build_electra_pair  # noqa: E402
from replayloader_electra.pretrain.losses import make_optimizer  # noqa: E402
from tests.electra.checkpoint_files import kill_while_saving, load_survivor, save_step, saving_parts  # noqa: E402

WORDS = ("the a cat dog sat on mat ran to house big small red blue quickly slowly and but then saw bird tree "
         "under over green old").split()


# ----------------------------------------------------------------------------- corruptions
def make_run(root: Path) -> Path:
    rng = np.random.default_rng(0)
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(" ".join(rng.choice(WORDS, size=rng.integers(5, 15))) + "." for _ in range(1500)))
    run = root / "run"
    pretrain(PretrainConfig(preset="tiny", corpus=str(corpus), vocab_size=200, max_len=32, batch_size=8, steps=6,
                            buffer_size=32, warmup_steps=2, checkpoint_every=2, keep_checkpoints=5,
                            output_dir=str(run), cache_dir=str(root / "cache"), progress=False, export_hf=False))
    return run


def _edit_json(path: Path, rng: random.Random) -> str:
    """Change one leaf of the JSON document (a number, a string, a list entry) and say which."""
    document = json.loads(path.read_text())
    leaves = []

    def walk(node, trail):
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else None
        if items is None:
            leaves.append(trail)
            return
        for key, value in items:
            walk(value, trail + [key])

    walk(document, [])
    trail = rng.choice([t for t in leaves if t])
    parent = document
    for key in trail[:-1]:
        parent = parent[key]
    old = parent[trail[-1]]
    if isinstance(old, bool) or old is None:
        new = not old
    elif isinstance(old, (int, float)):
        new = old + rng.choice([-1, 1]) * (1 if isinstance(old, int) else 0.5)
    else:
        new = str(old) + "x"
    parent[trail[-1]] = new
    path.write_text(json.dumps(document))
    return "edit " + ".".join(map(str, trail))


def corrupt(step_dir: Path, rng: random.Random) -> tuple[str, str | None]:
    """One random fault in ``step_dir``; returns (what was done, the file that must be named, or None)."""
    files = sorted(p for p in step_dir.iterdir() if p.is_file())
    target = rng.choice(files)
    kind = rng.choice(["truncate", "flip", "delete", "append", "garbage", "edit", "empty"])
    data = target.read_bytes()
    if kind == "truncate":
        target.write_bytes(data[:rng.randrange(len(data))])
    elif kind == "flip":
        position = rng.randrange(len(data))
        target.write_bytes(data[:position] + bytes([data[position] ^ (1 << rng.randrange(8))]) + data[position + 1:])
    elif kind == "delete":
        target.unlink()
    elif kind == "append":
        target.write_bytes(data + os.urandom(rng.randint(1, 64)))
    elif kind == "garbage":
        target.write_bytes(os.urandom(rng.randint(0, 256)))
    elif kind == "edit":
        target = rng.choice([f for f in files if f.suffix == ".json"])
        return _edit_json(target, rng) + f" of {target.name}", target.name
    else:
        shutil.rmtree(step_dir)
        step_dir.mkdir()
        return "empty the directory", "state.json"
    return f"{kind} {target.name}", target.name


def corruption_trials(run: Path, count: int, seed: int, work: Path) -> list[dict]:
    rng = random.Random(seed)
    config = PretrainConfig(**json.loads((run / "config.json").read_text()))
    vocab = len(prepare_pretraining_data(config.corpus, config.cache_dir, config.vocab_size, config.max_len).tokenizer)
    rows = []
    for trial in range(count):
        copy = work / f"c{trial}"
        shutil.copytree(run, copy)
        newest = copy / "checkpoints" / "step-00000006"
        what, named = corrupt(newest, rng)
        row = {"part": "corruption", "trial": trial, "fault": what}
        try:
            chosen = checkpoint.choose_checkpoint(copy)
            row["chosen_step"] = chosen.step
            row["detected"] = bool(chosen.skipped)
            row["named_file"] = bool(chosen.skipped) and Path(chosen.skipped[0].path).name == named
            row["problem"] = chosen.skipped[0].problem if chosen.skipped else None
            pair = build_electra_pair(model_preset(config), vocab, 0)
            step, _ = checkpoint.load_checkpoint(chosen.path, pair, make_optimizer(pair, 1e-3, 0.01),
                                                 state=chosen.state)
            row["loaded_step"] = step
        except (UserError, ValueError, OSError) as error:
            row["error"] = f"{type(error).__name__}: {error}"
        row["ok"] = row.get("detected") is True and row.get("named_file") is True and row.get("loaded_step") == 4
        rows.append(row)
        shutil.rmtree(copy)
    return rows


# ----------------------------------------------------------------------------- kills
def kill_trials(count: int, seed: int, work: Path) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for trial in range(count):
        directory = work / f"k{trial}"
        row = {"part": "kill", "trial": trial, "temporaries_left": kill_while_saving(directory, rng.uniform(0, 0.3)),
               "steps_left": [p.name for p in checkpoint.step_dirs(directory)]}
        try:
            row["loaded_step"] = load_survivor(directory)
            row["ok"] = True
        except (AssertionError, UserError, ValueError, OSError) as error:
            row["ok"], row["error"] = False, f"{type(error).__name__}: {error}"
        rows.append(row)
        shutil.rmtree(directory)
    return rows


# ----------------------------------------------------------------------------- a full disk
def full_disk_trial(work: Path) -> dict:
    mount = work / "tiny-fs"
    mount.mkdir()
    size_kb = 2400  # one checkpoint of the saver's model is ~1.7 MB: a second cannot be written beside it
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        return {"part": "full_disk", "skipped": f"cannot mount a tmpfs here: {made.stderr.strip()}"}
    try:
        parts = saving_parts()
        row = {"part": "full_disk", "filesystem_kb": size_kb}
        for step in (1, 2, 3):
            try:
                save_step(mount, step, parts)
            except checkpoint.CheckpointNotWritten as error:
                row["message"], row["failed_step"] = str(error), step
                break
        row["left"] = sorted(p.name for p in mount.iterdir())
        checkpoint.verify_checkpoint(mount / "step-00000001")
        row["ok"] = row.get("failed_step") == 2 and row["left"] == ["step-00000001"] and \
            "step-00000001 is intact" in row.get("message", "")
        return row
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corruptions", type=int, default=200)
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="JSONL of every trial")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rows = corruption_trials(make_run(work), args.corruptions, args.seed, work)
        rows += kill_trials(args.kills, args.seed, work)
        rows.append(full_disk_trial(work))
    if args.out:
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    corruptions = [r for r in rows if r["part"] == "corruption"]
    kills = [r for r in rows if r["part"] == "kill"]
    disk = rows[-1]
    kinds = Counter(r["fault"].split()[0] for r in corruptions)
    print(f"corruptions: {len(corruptions)} ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})")
    print(f"  detected {sum(r.get('detected') is True for r in corruptions)}, damaged file named "
          f"{sum(r.get('named_file') is True for r in corruptions)}, fell back to step 4 and loaded "
          f"{sum(r.get('loaded_step') == 4 for r in corruptions)}, failures {sum(not r['ok'] for r in corruptions)}")
    print(f"kills: {len(kills)}; killed during a save or a prune (a temporary left) "
          f"{sum(bool(r['temporaries_left']) for r in kills)}; every step directory verified and the newest loaded "
          f"{sum(r['ok'] for r in kills)}; failures {sum(not r['ok'] for r in kills)}")
    print(f"full disk: {disk.get('skipped') or ('ok' if disk['ok'] else 'FAILED') + ': ' + disk.get('message', '')}")
    failures = [r for r in rows if r.get("ok") is False]
    for row in failures[:10]:
        print("FAILURE", json.dumps(row))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
