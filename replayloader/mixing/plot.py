"""Draw the weight trajectory of a mixture's log (``MixtureSampler(log_path=...)``): one line per source.

    python -m replayloader.mixing.plot LOG.jsonl -o weights.png

Needs matplotlib (not a dependency of the library); without it the command says so and exits with status 2.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path


def read_log(path: str | os.PathLike) -> tuple[list[int], dict[str, list[float]]]:
    """The steps (ascending) and, per source name, the weights of a JSONL log (lines ``{"step", "weights":
    {name: w}}``). A step logged twice keeps its last line: a run resumed from a checkpoint appends again the
    steps it had logged after that checkpoint."""
    rows: dict[int, dict[str, float]] = {}
    names: list[str] | None = None
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            step, row = int(record["step"]), {str(k): float(v) for k, v in dict(record["weights"]).items()}
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: not a mixture log line ({type(exc).__name__}: {exc})") from exc
        if names is not None and set(row) != set(names):
            raise ValueError(f"{path}:{number}: sources {sorted(row)} differ from the first line's {sorted(names)}")
        names = list(row) if names is None else names
        rows[step] = row
    if names is None:
        raise ValueError(f"{path}: the log is empty")
    steps = sorted(rows)
    return steps, {name: [rows[step][name] for step in steps] for name in names}


def plot_weights(log: str | os.PathLike, out: str | os.PathLike, *, title: str | None = None) -> Path:
    """Draw the log's weights against the step into ``out`` (any format matplotlib writes); return its path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("plotting the mixture weights needs matplotlib: pip install matplotlib") from exc
    steps, weights = read_log(log)
    figure, axes = plt.subplots(figsize=(7, 4))
    for name, values in weights.items():
        axes.plot(steps, values, label=name)
    axes.set_xlabel("step")
    axes.set_ylabel("mixture weight")
    axes.set_ylim(0, max(max(v) for v in weights.values()) * 1.05)
    axes.set_title(title or Path(log).name)
    axes.legend(loc="best", fontsize="small")
    figure.tight_layout()
    out = Path(out)
    figure.savefig(out)
    plt.close(figure)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replayloader.mixing.plot", description=__doc__.splitlines()[0])
    parser.add_argument("log", help="a JSONL weight log written by MixtureSampler(log_path=...)")
    parser.add_argument("-o", "--out", required=True, help="the image to write (e.g. weights.png)")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    try:
        written = plot_weights(args.log, args.out, title=args.title)
    except (ImportError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
