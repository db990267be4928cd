"""What a newcomer meets first on the command line (issue 33, item 5): a bad ``--glue-dir`` stops the command
before any work, the usage line names the command as typed, every flag is listed with dashes (the underscore
spellings still parse), and a progress bar redirected to a file stays quiet."""
from __future__ import annotations

import argparse
import io
import re
import sys
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from replayloader_electra import cli, output  # noqa: E402
from replayloader_electra.output import progress_bar  # noqa: E402

SHOWN_UNDERSCORE_FLAG = re.compile(r"--[A-Za-z0-9-]*_")  # a long flag with "_" in it (metavars are upper case)


def subcommands(prog: str = cli.COMMAND) -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser(prog)
    return next(a for a in parser._actions if a.dest == "command").choices


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ----------------------------------------------------------------------------- --glue-dir, checked while parsing
@pytest.fixture
def no_work(monkeypatch):
    """Pretraining and fine-tuning fail the test if they are ever started."""
    import replayloader_electra.finetune.api as api
    import replayloader_electra.pretrain as pretrain_package

    def started(*args, **kwargs):
        raise AssertionError("work started despite a bad --glue-dir")

    monkeypatch.setattr(pretrain_package, "pretrain", started)
    monkeypatch.setattr(api, "finetune_glue", started)


def bad_glue_dirs(tmp_path) -> dict[str, tuple[str, str]]:
    """A bad value and the words that say what is wrong with it."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "SST-2-only").mkdir()
    (tmp_path / "SST-2-only" / "train.tsv").write_text("sentence\tlabel\n")
    (tmp_path / "a-file").write_text("")
    return {"missing": (str(tmp_path / "nonexistent"), "does not exist"),
            "empty": (str(tmp_path / "empty"), "holds none of the GLUE task folders"),
            "one task's folder": (str(tmp_path / "SST-2-only"), "pass the directory above it"),
            "a file": (str(tmp_path / "a-file"), "is not a directory")}


@pytest.mark.parametrize("case", ["missing", "empty", "one task's folder", "a file"])
@pytest.mark.parametrize("command", [[], ["compare"], ["finetune", "--checkpoint", "x", "--task", "sst2"]])
def test_a_bad_glue_dir_is_refused_before_any_work(case, command, tmp_path, capsys, no_work):
    value, problem = bad_glue_dirs(tmp_path)[case]
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*command, "--glue-dir", value, "--output-dir", str(out)])
    assert exit_info.value.code == 2  # as for any argparse error
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"{cli.COMMAND} {(command or ['compare'])[0]}: error: argument --glue-dir: "), line
    assert repr(value) in line and problem in line, line  # the option, the bad value, what is wrong
    assert "official glue_data layout" in line and "SST-2/" in line and "'hub'" in line, line  # what is valid
    assert not out.exists()  # nothing was written: the command never started


def test_the_underscore_spelling_is_checked_the_same(tmp_path, capsys, no_work):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["compare", "--glue_dir", str(tmp_path / "nonexistent")])
    assert exit_info.value.code == 2 and "argument --glue-dir: " in one_line(capsys.readouterr().err)


def test_hub_a_glue_directory_none_and_absent_are_accepted(tmp_path):
    (tmp_path / "glue" / "SST-2").mkdir(parents=True)
    for command in ("compare", "finetune"):
        parser = subcommands()[command]
        base = ["--checkpoint", "x", "--task", "sst2"] if command == "finetune" else []
        for value, parsed in [("hub", "hub"), ("hf:someone/glue", "hf:someone/glue"),
                              (str(tmp_path / "glue"), str(tmp_path / "glue")), ("none", None)]:
            assert parser.parse_args([*base, "--glue-dir", value]).glue_dir == parsed, value
        assert not hasattr(parser.parse_args(base), "glue_dir")  # absent: the option's default applies later
    # absent, without ../shared/data/glue (or `none`): compare skips the fine-tune and says why, and how to fix it
    reason = cli.finetune_skip_reason(cli.CompareOptions(), None)
    assert reason.startswith("fine-tuning skipped: no GLUE data given") and "--glue-dir hub" in reason
    assert cli.finetune_skip_reason(cli.CompareOptions(), "hub") is None


# ----------------------------------------------------------------------------- the program name
@pytest.mark.parametrize("argv0, main_module, prog", [
    ("/home/me/.venv/bin/replayloader-tmr", None, "replayloader-tmr"),  # the console command
    ("C:/venv/Scripts/replayloader-tmr.exe", None, "replayloader-tmr"),
    ("/repo/integrations/electra/__main__.py", "replayloader_electra.__main__", "python -m replayloader_electra"),
    ("examples/electra_tmr.py", None, "python examples/electra_tmr.py"),  # a script, as typed
    ("-c", None, cli.COMMAND), ("", None, cli.COMMAND),
])
def test_the_program_name_is_the_command_as_invoked(argv0, main_module, prog):
    assert cli.invoked_as(argv0, main_module) == prog


def test_the_two_command_lines_share_the_program_name_without_importing_each_other():
    """``cli`` imports ``finetune.cli`` (its finetune subcommand); the name both print comes from a third module,
    ``program``, so ``finetune.cli`` imports nothing of ``cli`` and the two form no import circle."""
    import ast
    from pathlib import Path

    from replayloader_electra import program
    from replayloader_electra.finetune import cli as finetune_cli

    assert cli.invoked_as is program.invoked_as and finetune_cli.invoked_as is program.invoked_as
    tree = ast.parse(Path(finetune_cli.__file__).read_text())
    imported = {(node.level, node.module) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert (2, "cli") not in imported and (2, None) not in imported, imported  # no `from ..cli`, `from .. import`


def test_the_console_command_shows_its_own_name(monkeypatch, capsys):
    """As ``replayloader-tmr`` runs it: ``main()`` reading ``sys.argv``, ``__main__`` the console wrapper."""
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", None, raising=False)  # not started with -m
    monkeypatch.setattr(sys, "argv", ["/home/me/.venv/bin/replayloader-tmr", "--help"])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: replayloader-tmr [-h]")
    monkeypatch.setattr(sys, "argv", ["/home/me/.venv/bin/replayloader-tmr", "pretrain", "--steps", "many"])
    with pytest.raises(SystemExit):
        cli.main()
    assert one_line(capsys.readouterr().err).startswith("replayloader-tmr pretrain: error: argument --steps")
    monkeypatch.setattr(sys, "argv", ["examples/electra_tmr.py", "compare", "--help"])
    with pytest.raises(SystemExit):
        cli.main()
    assert capsys.readouterr().out.startswith("usage: python examples/electra_tmr.py compare [-h]")


def test_arguments_handed_in_by_code_show_the_installed_command(capsys):
    with pytest.raises(SystemExit):
        cli.main(["pretrain", "--steps", "many"])
    assert one_line(capsys.readouterr().err).startswith(f"{cli.COMMAND} pretrain: error: ")


# ----------------------------------------------------------------------------- dashes, underscore aliases hidden
def test_every_flag_of_every_command_is_listed_with_dashes():
    parser = cli.build_parser()
    helps = {"": parser.format_help(), **{name: sub.format_help() for name, sub in subcommands().items()}}
    for name, text in helps.items():
        assert not SHOWN_UNDERSCORE_FLAG.findall(text), (name, SHOWN_UNDERSCORE_FLAG.findall(text)[:5])
    assert "--batch-size" in helps["compare"] and "--finetune-batch-size" in helps["compare"]
    assert "--no-progress" in helps["pretrain"] and "--glue-dir" in helps["finetune"]


def _sample(action: argparse.Action) -> list[str]:
    """Command-line words that set ``action``: none for a switch, else the first value its type accepts."""
    if action.nargs == 0:
        return []
    if action.choices:
        return [str(next(c for c in action.choices if c is not None))]
    for text in ("3", "false", "hub", "x"):
        try:
            (action.type or str)(text)
        except Exception:  # noqa: BLE001 - try the next kind of value
            continue
        return [text]
    raise AssertionError(f"no sample value for {action.option_strings}")


@pytest.mark.parametrize("command", list(subcommands()))
def test_every_underscore_spelling_still_parses_to_the_same_value(command):
    parser = subcommands()[command]
    required = [word for action in parser._actions if action.required
                for word in (action.option_strings[0], *_sample(action))]
    hidden = {flag: action for flag, action in parser._option_string_actions.items()
              if flag not in action.option_strings}
    if command in ("compare", "pretrain", "finetune"):
        assert {"--batch_size", "--no_progress"} <= set(hidden), sorted(hidden)[:10]
    for flag, action in hidden.items():
        dashed = flag.replace("_", "-")
        assert dashed in action.option_strings, (flag, action.option_strings)  # the alias of a listed flag
        value = _sample(action)
        assert vars(parser.parse_args([*required, flag, *value])) == vars(parser.parse_args([*required, dashed,
                                                                                             *value])), flag
    assert len(hidden) >= 10 or command in ("export", "upgrade-checkpoint", "heldout")


def test_mixed_spellings_in_an_existing_script_keep_working():
    args = subcommands()["compare"].parse_args(["--batch_size", "8", "--finetune_seeds", "1", "2", "--no_finetune",
                                                "--glue_dir", "hub", "--max-len", "32"])
    assert (args.batch_size, args.finetune_seeds, args.finetune, args.glue_dir, args.max_len) == \
        (8, [1, 2], False, "hub", 32)


# ----------------------------------------------------------------------------- progress bars
class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run_bar(stream, seconds: float, **kwargs) -> str:
    bar = progress_bar(total=10**6, file=stream, desc="steps", **kwargs)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        bar.update(1)
        time.sleep(0.002)
    bar.close()
    return stream.getvalue()


def test_a_progress_bar_is_quiet_when_its_stream_is_not_a_terminal(monkeypatch):
    assert _run_bar(Terminal(), 0.6).count("\r") >= 3  # a terminal redraws often: the line is overwritten
    assert _run_bar(io.StringIO(), 0.6) == ""  # a log: short work leaves no trace at all
    assert _run_bar(Terminal(), 0.3, enabled=False) == ""  # --no-progress
    bar = progress_bar(total=3, file=io.StringIO())
    assert bar.mininterval == bar.maxinterval == bar.delay == output.REDIRECTED_BAR_SECONDS == 30
    bar.close()
    # long work in a log: a few redraws (at most one per interval) and the final state, not one per update
    monkeypatch.setattr(output, "REDIRECTED_BAR_SECONDS", 0.3)
    log = _run_bar(io.StringIO(), 1.3)
    assert 1 <= log.count("\r") <= 1.3 / 0.3 + 2 and log.endswith("\n"), log


@pytest.mark.parametrize("module", ["torch", "transformers"])
def test_without_the_electra_extra_the_command_names_it_in_one_line_and_exits_2(module):
    """``pip install replayloader`` installs ``replayloader-tmr`` too; without the extra, ``--help`` must not die
    in a ModuleNotFoundError traceback. Simulated: the module set to None in sys.modules (import fails)."""
    import subprocess
    import sys

    code = (f"import sys; sys.modules[{module!r}] = None; sys.argv = ['replayloader-tmr', '--help']\n"
            "from replayloader_electra.cli import main\nsys.exit(main())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0] == (f"error: replayloader-tmr needs the electra extra, which is not installed (no module named "
                        f"{module!r}): pip install 'replayloader[electra]'")
