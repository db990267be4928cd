"""Options declared once: every command's flags come from the option dataclasses (through HfArgumentParser), with
their defaults, booleans settable both ways, optional values resettable, and bad values named."""
from __future__ import annotations

from dataclasses import MISSING, fields

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from replayloader_electra import cli  # noqa: E402
from replayloader_electra.flags import OptionSet, ProcessOptions, options_from, typed_options  # noqa: E402
from replayloader_electra.finetune.options import FINETUNE_OPTIONS, SubsetOptions, TrainingOptions  # noqa: E402
from replayloader_electra.pretrain import PretrainConfig, PretrainResult  # noqa: E402
from replayloader_electra.pretrain.heldout import HeldoutConfig  # noqa: E402

from .checkpoint_files import write_config_only_checkpoint  # noqa: E402

COMMANDS = {"pretrain": (PretrainConfig, ProcessOptions), "finetune": (*FINETUNE_OPTIONS, ProcessOptions),
            "heldout": (HeldoutConfig, ProcessOptions)}


def command_parser(name: str):
    parser = cli.build_parser()
    return next(a for a in parser._actions if a.dest == "command").choices[name]


def default_of(f):
    return f.default_factory() if f.default_factory is not MISSING else f.default


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_option_is_one_flag_with_its_default(command):
    parser = command_parser(command)
    for cls in COMMANDS[command]:
        for f in fields(cls):
            dashed = "--" + f.name.replace("_", "-")
            owners = [a for a in parser._actions if a.dest == f.name and not a.option_strings[0].startswith("--no")]
            assert len(owners) == 1, f.name
            assert dashed in owners[0].option_strings, f.name  # listed with dashes; the underscore spelling
            assert parser._option_string_actions["--" + f.name] is owners[0], f.name  # parses, unlisted
            default = default_of(f)
            if default not in (None, MISSING):  # shown, or the help says in words what the default is
                shown = " ".join(map(str, default)) if isinstance(default, list) else str(default)
                assert f"(default: {shown})" in owners[0].help or "(default" in f.metadata["help"], f.name
    required = [a.option_strings[0] for a in parser._actions if a.required]
    minimal = [arg for flag in required for arg in (flag, "x" if flag != "--task" else "sst2")]
    args = parser.parse_args(minimal)
    for cls in COMMANDS[command]:  # nothing typed: exactly the dataclass defaults
        built = options_from(args, cls)
        assert all(getattr(built, f.name) == default_of(f) for f in fields(cls) if default_of(f) is not MISSING)


def test_spellings_in_use_keep_working():
    args = command_parser("pretrain").parse_args(["--batch-size", "8", "--batch_size", "16", "--lr", "1e-3",
                                                  "--clip", "0.5", "--no-progress", "--no-export-hf"])
    assert typed_options(args, PretrainConfig) == {"batch_size": 16, "learning_rate": 1e-3, "clip_norm": 0.5,
                                                   "progress": False, "export_hf": False}


@pytest.mark.parametrize("command, name", [("pretrain", "compile"), ("pretrain", "progress"),
                                           ("pretrain", "export_hf"), ("finetune", "amp"), ("finetune", "progress")])
def test_every_boolean_is_settable_both_ways(command, name):
    parser = command_parser(command)
    base = ["--checkpoint", "x", "--task", "sst2"] if command == "finetune" else []
    dashed = name.replace("_", "-")
    for argv, value in ([f"--{dashed}"], True), ([f"--{dashed}", "false"], False), ([f"--{name}", "yes"], True), \
                       ([f"--no-{dashed}"], False), ([f"--no_{name}"], False), ([f"--{dashed}", f"--no-{dashed}"], False):
        assert getattr(parser.parse_args([*base, *argv]), name) is value, argv


def test_optional_options_reset_to_none_and_values_keep_their_type():
    parser = command_parser("pretrain")
    for word in ("none", "None", "default"):
        args = parser.parse_args(["--eviction", word, "--steps", word, "--beta", word])
        assert typed_options(args, PretrainConfig) == {"eviction": None, "steps": None, "beta": None}
    assert parser.parse_args(["--steps", "5"]).steps == 5
    assert command_parser("finetune").parse_args(["--checkpoint", "x", "--task", "sst2", "--preset", "none"]).preset \
        is None


def test_a_resumed_run_can_undo_a_saved_compile_and_eviction(tmp_path):
    saved = PretrainConfig(variant="tmr-loss_diff", steps=8, compile=True, eviction="fifo",
                           output_dir=str(tmp_path / "run"))
    write_config_only_checkpoint(tmp_path / "run" / "checkpoints" / "step-00000004", saved, step=4)
    parser = cli.build_parser()
    kept = cli.pretrain_config(parser.parse_args(["pretrain", "--resume", str(tmp_path / "run")]))
    assert (kept.compile, kept.eviction) == (True, "fifo")
    undone = cli.pretrain_config(parser.parse_args(["pretrain", "--resume", str(tmp_path / "run"), "--no-compile",
                                                    "--eviction", "none"]))
    assert (undone.compile, undone.eviction, undone.steps) == (False, None, 8)


@pytest.mark.parametrize("flag", ["--batch-size", "--vocab-size", "--max-len"])
def test_zero_is_rejected_not_replaced_by_the_presets_value(flag, tmp_path, capsys):
    status = cli.main(["pretrain", flag, "0", "--output-dir", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and f"{flag} must be" in err and "got 0" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists()  # rejected before anything is written


@pytest.mark.parametrize("argv", [["pretrain"], ["finetune", "--checkpoint", "x", "--task", "sst2"], ["compare"]])
def test_threads_are_validated_the_same_everywhere(argv, capsys):
    assert cli.main([*argv, "--threads", "0"]) == 2
    assert capsys.readouterr().err.strip() == "error: --threads must be >= 1 (or none), got 0"


def test_compare_takes_the_finetune_options_with_its_own_defaults():
    parser = command_parser("compare")
    subset_set, training_set = (OptionSet(SubsetOptions, "finetune_", cli.COMPARE_FINETUNE_DEFAULTS),
                                OptionSet(TrainingOptions, "finetune_"))
    untyped = parser.parse_args([])
    assert subset_set.parsed(untyped).max_train_examples == 8000 and subset_set.parsed(untyped).seeds == [0]
    assert training_set.parsed(untyped) == TrainingOptions()  # the finetune command's defaults
    typed = parser.parse_args(["--finetune-lr", "0.01", "--finetune-train-examples", "64", "--finetune-seeds", "1",
                               "2", "--finetune-batch-size", "8", "--no-finetune"])
    assert (training_set.parsed(typed).learning_rate, training_set.parsed(typed).batch_size) == (0.01, 8)
    assert (subset_set.parsed(typed).max_train_examples, subset_set.parsed(typed).seeds) == (64, [1, 2])
    assert options_from(typed, cli.CompareOptions).finetune is False


def test_only_rank_zero_prints(monkeypatch, capsys):
    """Under torchrun every rank runs the command; the others' results are not printed (no `{}`, no second
    'wrote' line)."""
    import replayloader_electra.pretrain as pretrain_package

    def fake(config, is_main):
        return PretrainResult(config, "OUT", None, "OUT/metrics.jsonl", "", {"steps": 1} if is_main else {},
                              is_main=is_main)

    monkeypatch.setattr(pretrain_package, "pretrain", lambda config: fake(config, False))
    assert cli.main(["pretrain", "--no-progress"]) == 0
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(pretrain_package, "pretrain", lambda config: fake(config, True))
    assert cli.main(["pretrain", "--no-progress"]) == 0
    assert capsys.readouterr().out.count("wrote OUT") == 1
