"""Faults injected into pretraining checkpoints and their inputs: damaged, missing and edited files, a full disk,
kill -9 during a save, a longer resumed run, a resumed copy, and corpus and GLUE files that are not what they
claim. Each case must end in the newest good checkpoint or in one line naming the file and the problem.

One finished 6-step run (checkpoints at steps 2, 4, 6) is made once and copied by the tests that damage it.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import random
import shutil
from pathlib import Path

import pytest
from safetensors import SafetensorError

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("datasets")

from replayloader_electra import cli  # noqa: E402
from replayloader_electra.errors import UserError  # noqa: E402
from replayloader_electra.pretrain import checkpoint, pretrain, read_metrics, resume_config  # noqa: E402

from .checkpoint_files import kill_while_saving, load_survivor  # noqa: E402
from .test_pretrain import tiny_config  # noqa: E402

STEPS, EVERY = 6, 2


@pytest.fixture(scope="module")
def finished_run(corpus, tmp_path_factory, one_torch_thread) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    pretrain(tiny_config(corpus, out, steps=STEPS, checkpoint_every=EVERY, keep_checkpoints=5, warmup_steps=2,
                         dropout=0.1))
    return out


@pytest.fixture
def run_copy(finished_run, tmp_path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(finished_run, copy)
    return copy


def step_dir(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step-{step:08d}"


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


# ----------------------------------------------------------------------------- damaged checkpoints
def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _edit_step(path: Path) -> None:
    state = json.loads(path.read_text())
    path.write_text(json.dumps({**state, "step": 5}))


DAMAGE = {  # what is done to the newest checkpoint (step 6), and the file the fallback line must name
    "truncated tensors": ("tensors.safetensors", _truncate),
    "truncated rank tensors": ("rank-00000.safetensors", _truncate),
    "missing rank json": ("rank-00000.json", Path.unlink),
    "garbage state.json": ("state.json", lambda p: p.write_bytes(os.urandom(64))),
    "missing state.json": ("state.json", Path.unlink),
    "edited step": ("state.json", _edit_step),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_newest_checkpoint_falls_back_to_the_last_good_one_and_says_why(run_copy, damage):
    name, hurt = DAMAGE[damage]
    hurt(step_dir(run_copy, 6) / name)
    config = resume_config(str(run_copy))
    assert config.resume == str(step_dir(run_copy, 4))  # before the fix: step 6, then a traceback or wrong data
    chosen = checkpoint.choose_checkpoint(run_copy)
    assert [e.path for e in chosen.skipped] == [str(step_dir(run_copy, 6) / name)]
    assert "skipped newer: " + str(step_dir(run_copy, 6) / name) in chosen.describe()
    assert pickle.loads(pickle.dumps(chosen)) == chosen  # rank 0 sends its choice to the other ranks


def test_an_empty_newest_directory_is_reported_not_skipped_silently(run_copy):
    step_dir(run_copy, 8).mkdir()
    chosen = checkpoint.choose_checkpoint(run_copy)
    assert chosen.step == 6
    assert [(e.path, e.problem) for e in chosen.skipped] == [
        (str(step_dir(run_copy, 8) / "state.json"), "missing (the checkpoint directory is empty)")]


def test_a_resume_after_an_edited_step_says_so_in_one_line_and_deletes_no_line_it_cannot_prove(
        finished_run, run_copy, capsys):
    """The step-6 state says step 5: before the fix it was loaded as step 5 and step 6 was trained twice."""
    _edit_step(step_dir(run_copy, 6) / "state.json")
    assert cli.main(["pretrain", "--resume", str(run_copy), "--no-progress"]) == 0
    resumed_lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("resumed from")]
    assert resumed_lines == [f"resumed from step 4 of {run_copy} (step-00000004); skipped newer: "
                             f"{step_dir(run_copy, 6) / 'state.json'}: was changed after it was written (its "
                             "content does not match the digest in its manifest)"]
    expected = read_metrics(finished_run / "metrics.jsonl")
    got = read_metrics(run_copy / "metrics.jsonl")
    for key in ("step", "generator_loss", "discriminator_loss", "lr"):  # 1-4 kept, 5-6 recomputed exactly
        assert [r[key] for r in got] == [r[key] for r in expected], key
    checkpoint.verify_checkpoint(step_dir(run_copy, 6))  # rewritten, whole


def test_no_checkpoint_that_verifies_is_one_error_naming_every_file(run_copy, capsys):
    for step in (2, 4, 6):
        _truncate(step_dir(run_copy, step) / "tensors.safetensors")
    assert cli.main(["pretrain", "--resume", str(run_copy), "--no-progress"]) == 2
    err = one_line(capsys)
    assert f"no checkpoint under {run_copy} verifies" in err
    for step in (2, 4, 6):
        assert str(step_dir(run_copy, step) / "tensors.safetensors") + ": damaged" in err


@pytest.mark.parametrize("flag, value", [("--variant", "electra"), ("--preset", "mini")])
def test_a_checkpoint_of_another_preset_or_variant_is_refused_in_one_line(run_copy, capsys, flag, value):
    before = tree_digest(run_copy)
    assert cli.main(["pretrain", "--resume", str(run_copy), flag, value, "--no-progress"]) == 2
    err = one_line(capsys)
    saved = "preset tiny, variant tmr-loss_diff"
    asked = f"preset {value}, variant tmr-loss_diff" if flag == "--preset" else "preset tiny, variant electra"
    assert f"is {saved}; this run asks for {asked}" in err
    assert tree_digest(run_copy) == before


# ----------------------------------------------------------------------------- checkpoints of an older version
def _as_format_3(path: Path) -> None:
    """What a checkpoint written before format 4 holds: the same files, no manifest, no step in the rank files."""
    state = json.loads((path / "state.json").read_text())
    del state["manifest"]
    (path / "state.json").write_text(json.dumps({**state, "format": 3}))
    for meta_file in path.glob("rank-*.json"):
        meta = json.loads(meta_file.read_text())
        del meta["step"]
        meta_file.write_text(json.dumps(meta))


def test_an_older_checkpoint_is_refused_with_the_upgrade_command_and_resumes_exactly_once_upgraded(
        finished_run, run_copy, capsys, tmp_path):
    for step in (4, 6):
        _as_format_3(step_dir(run_copy, step))
    assert cli.main(["export", "--checkpoint", str(step_dir(run_copy, 6)), "--output-dir", str(tmp_path / "x")]) == 2
    assert f"run `electra_tmr.py upgrade-checkpoint --checkpoint {step_dir(run_copy, 6)}`" in one_line(capsys)

    assert cli.main(["upgrade-checkpoint", "--checkpoint", str(run_copy)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{step_dir(run_copy, 2)}: already format 4 (verified)",
        f"{step_dir(run_copy, 4)}: upgraded from format 3 to 4",
        f"{step_dir(run_copy, 6)}: upgraded from format 3 to 4"]
    for step in (4, 6):
        upgraded, original = (checkpoint.verify_checkpoint(step_dir(run, step)) for run in (run_copy, finished_run))
        assert {k: v for k, v in upgraded.items() if k != "manifest"} == \
            {k: v for k, v in original.items() if k != "manifest"}
    assert cli.main(["pretrain", "--resume", str(step_dir(run_copy, 4)), "--no-progress"]) == 0
    expected, got = (read_metrics(run / "metrics.jsonl") for run in (finished_run, run_copy))
    for key in ("step", "generator_loss", "discriminator_loss", "lr"):  # steps 5-6 retrained from the upgrade
        assert [r[key] for r in got] == [r[key] for r in expected], key
    assert cli.main(["upgrade-checkpoint", "--checkpoint", str(step_dir(run_copy, 4))]) == 0  # again: a no-op


@pytest.mark.parametrize("fault, named", [
    ("truncated", "rank-00000.safetensors"), ("other_step", "rank-00000.json"), ("no_tensors", "tensors.safetensors")])
def test_an_older_checkpoint_that_fails_a_check_is_not_upgraded_and_not_changed(run_copy, capsys, fault, named):
    target = step_dir(run_copy, 4)
    _as_format_3(target)
    if fault == "truncated":
        _truncate(target / named)
    elif fault == "other_step":
        (target / named).write_text(json.dumps({**json.loads((target / named).read_text()), "step": 2}))
    else:
        (target / named).unlink()
    before = tree_digest(run_copy)
    assert cli.main(["upgrade-checkpoint", "--checkpoint", str(target)]) == 2
    assert f"checkpoint {target} cannot be upgraded: {target / named}" in one_line(capsys)
    assert tree_digest(run_copy) == before


# ----------------------------------------------------------------------------- longer runs, copies
def test_resuming_a_copy_with_more_steps_writes_only_the_copy_and_continues_the_schedule(
        finished_run, run_copy, capsys):
    original = tree_digest(finished_run)
    assert cli.main(["pretrain", "--resume", str(run_copy), "--steps", "10", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"resumed from step 6 of {run_copy} (step-00000006)\n" in out
    assert tree_digest(finished_run) == original  # before the fix: the original's saved --output-dir was written
    records = read_metrics(run_copy / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 11))
    saved = json.loads((run_copy / "config.json").read_text())
    assert saved["output_dir"] == str(run_copy)
    # the schedule of the new total (warmup 2, linear decay to 0 at step 10), resumed at step 6: step k trains at
    # peak * (10 - (k - 1)) / (10 - 2); before the fix step 7 trained at 0.0, then jumped
    peak = saved["learning_rate"]
    lrs = [r["lr"] for r in records[6:]]
    assert lrs[0] > 0
    assert lrs == pytest.approx([peak * (10 - (k - 1)) / 8 for k in range(7, 11)], rel=1e-12)
    assert max(abs(a - b) for a, b in zip(lrs, lrs[1:])) == pytest.approx(peak / 8)


# ----------------------------------------------------------------------------- a full disk
FULL_DISK = {  # how each writer reports a full disk (safetensors' own error was found by checks/fault_injection.py)
    "save_torch_file": lambda name: SafetensorError("Error while serializing: I/O error: No space left on device "
                                                    "(os error 28)"),
    "write_state": lambda name: OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), name),
}


@pytest.mark.parametrize("writer", list(FULL_DISK))
def test_a_full_disk_during_a_checkpoint_stops_the_run_in_one_line_and_keeps_the_previous_one(
        corpus, tmp_path, monkeypatch, capsys, writer):
    real_write = getattr(checkpoint, writer)

    def write_until_full(target, *args, **kwargs):
        name = str(args[0] if writer == "save_torch_file" else target)
        if "step-00000004" in name:
            real_write(target, *args, **kwargs)  # a file is on the disk when it fills up
            raise FULL_DISK[writer](name)
        return real_write(target, *args, **kwargs)

    monkeypatch.setattr(checkpoint, writer, write_until_full)
    run = tmp_path / "run"
    argv = ["pretrain", "--corpus", corpus["file"], "--cache-dir", corpus["cache"], "--vocab-size", "200",
            "--max-len", "32", "--batch-size", "8", "--buffer-size", "32", "--steps", "6", "--warmup-steps", "2",
            "--checkpoint-every", "2", "--no-export-hf", "--no-progress", "--output-dir", str(run)]
    assert cli.main(argv) == 2
    err = one_line(capsys)
    assert err.startswith("error: the checkpoint at step 4 was not written (") and "No space left" in err, err
    assert err.endswith(f"the previous checkpoint {step_dir(run, 2)} is intact; the run stops here"), err
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000002"]  # no partial left
    checkpoint.verify_checkpoint(step_dir(run, 2))
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2, 3, 4]


# ----------------------------------------------------------------------------- kill -9 during saves
def test_kill_9_at_random_points_of_saves_always_leaves_a_checkpoint_that_verifies_and_loads(tmp_path):
    """20 children, each killed at a random instant while it saves checkpoints back to back; afterwards every
    step directory verifies and the newest loads into a fresh model with the values of its step."""
    rng = random.Random(0)
    for attempt in range(20):
        kill_while_saving(tmp_path / f"try{attempt}", rng.uniform(0, 0.2))
        load_survivor(tmp_path / f"try{attempt}")


# ----------------------------------------------------------------------------- corpus and GLUE files
@pytest.mark.parametrize("content, cause", [
    (b"", "has no text: it is empty or holds only blank lines"),
    (b"some text\x00\x01\x02 binary", "is binary, not text (a NUL byte at byte offset 9)"),
    ("caf\u00e9 au lait\n".encode("latin-1"), "is not UTF-8 text: byte 0xe9 at byte offset 3 cannot be decoded"),
])
def test_a_corpus_file_that_is_not_text_is_one_line_naming_the_file_and_the_cause(tmp_path, capsys, content, cause):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(content)
    status = cli.main(["pretrain", "--corpus", str(bad), "--output-dir", str(tmp_path / "out"), "--no-progress"])
    err = one_line(capsys)
    assert status == 2 and f"corpus file {bad} {cause}" in err, err  # before: "An error occurred while ..."


@pytest.mark.parametrize("task, header, row, problem", [
    ("sst2", ["sentence", "label"], ["a fine film", ""], "line 2: the label (column 'label') is missing"),
    ("cola", None, ["gj04", "1", ""], "line 1: 3 field(s), expected at least 4 (a cut or extra column)"),
])
def test_glue_rows_without_a_label_or_with_a_cut_column_are_an_error_naming_the_line(tmp_path, task, header, row,
                                                                                   problem):
    from replayloader_electra.finetune.glue import GLUE_TASKS, read_glue_tsv

    path = tmp_path / "train.tsv"
    path.write_text("\n".join("\t".join(r) for r in ([header] if header else []) + [row, row]) + "\n")
    with pytest.raises(UserError, match="no usable row") as error:  # before: IndexError, or 0 rows kept
        read_glue_tsv(GLUE_TASKS[task], path)
    assert str(path) in str(error.value) and problem in str(error.value)


# ----------------------------------------------------------------------------- the metrics log
def test_metrics_log_readers_drop_a_torn_last_line_and_the_writer_cuts_it_off(tmp_path):
    from replayloader_electra.jsonl import JsonLinesWriter
    from replayloader.state.files import StateFileError

    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1}\n{"step": 2}\n{"st')  # a writer killed in the middle of line 3
    assert read_metrics(log) == [{"step": 1}, {"step": 2}]
    writer = JsonLinesWriter(log)
    writer.write({"step": 3})
    writer.close()
    assert log.read_text() == '{"step": 1}\n{"step": 2}\n{"step": 3}\n'
    log.write_text('{"step": 1}\n{"st\n{"step": 3}\n')
    with pytest.raises(StateFileError, match="line 2 is not JSON"):
        read_metrics(log)
