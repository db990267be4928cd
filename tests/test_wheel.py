"""The built wheel is a real package: installed into a fresh venv, run from a directory outside the checkout,
its console script does the main job on the embedded corpus, and it installs no top-level name but ours.

The venv reuses this interpreter's installed dependencies (torch & co.) through a path file, so the test needs
no download; the path entries are plain directories, so this environment's own editable install of the
checkout (a `.pth` hook) is not active there and cannot stand in for the wheel.
"""
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = {"replayloader", "replayloader_electra"}  # the top-level packages the wheel may install


def run(command: list, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run(command, cwd=cwd, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{command[:3]}... failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


def package_folders() -> set[str]:
    """Every package of the checkout under its installed name (the integration folder installs renamed)."""
    names = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "replayloader").rglob("__init__.py")}
    electra = ROOT / "integrations" / "electra"
    names |= {".".join(("replayloader_electra", *p.parent.relative_to(electra).parts))
              for p in electra.rglob("__init__.py")}
    return names


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the package sources, so the build writes nothing into the checkout."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    for name in ("replayloader", "integrations"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
         str(source)], cwd=out)
    (built,) = out.glob("replayloader-*.whl")
    return built


def test_wheel_holds_every_package_under_our_names_only(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == OURS  # no "integrations", no "tests", no "experiments"
    packages = {name.rsplit("/", 1)[0].replace("/", ".") for name in names if name.endswith("/__init__.py")}
    assert packages == package_folders()  # pyproject's package list misses no folder
    assert "replayloader_electra/__main__.py" in names
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)  # the Apache-2.0 text ships
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "replayloader-tmr = replayloader_electra.cli:main" in entry_points


def test_installed_console_script_runs_the_main_job_outside_the_checkout(wheel, tmp_path):
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    python = venv / "bin" / "python"
    venv_site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         cwd=tmp_path).stdout.strip())
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    (venv_site / "dependencies.pth").write_text("\n".join(sorted(ours)) + "\n")
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--force-reinstall",
         str(wheel)], cwd=tmp_path)

    where = run([str(python), "-c", "import importlib.util as u, replayloader, replayloader_electra; "
                 "print(replayloader.__file__); print(replayloader_electra.__file__); "
                 "print(u.find_spec('integrations'))"], cwd=tmp_path).stdout.split()
    assert all(Path(path).is_relative_to(venv_site) for path in where[:2])  # the wheel's copy, not the checkout
    assert where[2] == "None"

    out = tmp_path / "runs"
    done = run([str(venv / "bin" / "replayloader-tmr"), "--corpus", "python-topics", "--max-lines", "300",
                "--steps", "2", "--vocab-size", "300", "--max-len", "32", "--batch-size", "4", "--buffer-size", "8",
                "--threads", "1", "--no-finetune", "--no-progress", "--output-dir", str(out)], cwd=tmp_path)
    assert f"wrote {out / 'summary.md'}" in done.stdout
    assert "| electra | tmr-loss_diff |" in (out / "summary.md").read_text()
    for variant in ("electra", "tmr-loss_diff"):
        assert (out / variant / "discriminator" / "config.json").is_file()
        assert (out / variant / "summary.json").is_file()


def test_no_file_imports_the_integration_by_its_old_name():
    """The integration imports only as replayloader_electra (its folder keeps its name, and has no
    integrations/__init__.py, so nothing can import it by its folder path by mistake)."""
    import re

    old = re.compile(r"^\s*(from|import) integrations\.electra\b", re.M)
    ours = [p for p in ROOT.rglob("*.py") if not {".ci-venv", ".venv", "build", "site-packages"} & set(p.parts)]
    assert not [str(p.relative_to(ROOT)) for p in ours if old.search(p.read_text(errors="replace"))]
    assert not (ROOT / "integrations" / "__init__.py").exists()
