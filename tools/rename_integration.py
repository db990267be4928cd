"""Rename the integration's import name ``integrations.electra`` to ``replayloader_electra`` in every tracked
file, the name the wheel installs it under (pyproject.toml's package-dir; the folder stays integrations/electra/).

    python tools/rename_integration.py            # rewrite in place and print what changed
    python tools/rename_integration.py --check    # exit 1 if any file still uses the old name (nothing written)

Idempotent: run it again after merging branches that still write the old name. Folder paths
(``integrations/electra/...``) are left alone; only the dotted module name changes. It also removes
integrations/__init__.py, so nothing in the checkout can import the code under its old name by mistake.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OLD = re.compile(r"\bintegrations\.electra\b")
NEW = "replayloader_electra"
OLD_PACKAGE_MARKER = ROOT / "integrations" / "__init__.py"


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    files = []
    for name in names.decode().split("\0"):
        path = ROOT / name
        if name and path.is_file() and path != Path(__file__).resolve():
            try:
                path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue  # binary (plots, gzipped data)
            files.append(path)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report files with the old name, change nothing")
    args = parser.parse_args(argv)
    stale = []
    for path in tracked_text_files():
        text = path.read_text(encoding="utf-8")
        count = len(OLD.findall(text))
        if count:
            stale.append(path)
            print(f"{path.relative_to(ROOT)}: {count}")
            if not args.check:
                path.write_text(OLD.sub(NEW, text), encoding="utf-8")
    if OLD_PACKAGE_MARKER.exists():
        stale.append(OLD_PACKAGE_MARKER)
        print(f"{OLD_PACKAGE_MARKER.relative_to(ROOT)}: the old package's __init__.py")
        if not args.check:
            subprocess.run(["git", "rm", "-q", str(OLD_PACKAGE_MARKER)], cwd=ROOT, check=True)
    if args.check:
        return 1 if stale else 0
    print(f"{len(stale)} file(s) changed" if stale else "nothing to rename")
    return 0


if __name__ == "__main__":
    sys.exit(main())
