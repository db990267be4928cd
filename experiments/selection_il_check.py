"""Cross-check of the IL models against the library's `fit_irreducible` (issue 28; information, not an endpoint).

The runs of `selection_sst2.py` used IL models fit by the experiment's own `fit_il` (the library's validated
`fit_irreducible` landed after they were fit). This refits both variants (`full`, `cheap`) with
`replayloader.selection.irreducible.fit_irreducible`, same data, split, seed, steps and checkpoint interval, and
compares the held-out-slice accuracy, the chosen checkpoint, the cost, and the losses themselves with the ones the
runs used (from the cache ``runs/selection_cache/``, refit by `selection_sst2.py` if absent).

    python -m experiments.selection_il_check        # -> results/selection/il_check.md
"""
from __future__ import annotations

import argparse
import copy
import tempfile
from pathlib import Path

import numpy as np
import torch

from experiments import selection_sst2 as S  # noqa: E402

from replayloader.selection.irreducible import digest, fit_irreducible  # noqa: E402


def library_fit(data: S.Data, cfg: S.Config, path: Path):
    model, optimizer = S.make_model(cfg, cfg.il_seed)
    rng = np.random.default_rng(cfg.il_seed)
    state = {"order": np.empty(0, np.int64)}

    def train(n: int) -> None:
        for _ in range(n):
            if len(state["order"]) < cfg.batch:
                state["order"] = np.concatenate([state["order"], rng.permutation(len(data.fit_x))])
            index, state["order"] = state["order"][:cfg.batch], state["order"][cfg.batch:]
            loss = S.per_example_loss(model, data.fit_x, data.fit_y, index).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    steps = cfg.il_epochs * len(data.fit_x) // cfg.batch
    return fit_irreducible(
        path, train=train, evaluate=lambda: S.accuracy(model, data.val_x, data.val_y),
        snapshot=lambda: copy.deepcopy(model.state_dict()), restore=model.load_state_dict,
        score=lambda: S.chunked_losses(model, data.train_x, data.train_y),
        provenance={"data": digest(data.fit_x, data.fit_y), "heldout_slice": digest(data.val_x, data.val_y),
                    "train_split": digest(data.train_x, data.train_y), "label_noise_seed": cfg.flip_seed,
                    "split_seed": cfg.split_seed, "model": {"dim": cfg.dim, "batch": cfg.batch, "lr": cfg.lr,
                                                            "seed": cfg.il_seed}},
        steps=steps, eval_every=cfg.il_eval_every, target=None, num_examples=len(data.train_x))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir")
    parser.add_argument("--out", type=Path, default=S.OUT / "il_check.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    main_cfg = S.Config()
    data = S.load_data(S.data_dir(args.data_dir), main_cfg)
    rows = []
    for variant in ("full", "cheap"):
        used, meta = S.il_losses(data, main_cfg, variant, S.OUT)
        with tempfile.TemporaryDirectory() as tmp:
            lib = library_fit(data, S.il_config(main_cfg, variant), Path(tmp) / "il.npz")
        rows.append([variant, f"{meta['heldout_slice_accuracy']:.4f} @ {meta['checkpoint_step']}",
                     f"{lib.quality:.4f} @ {lib.best_step}", f"{meta['cpu_s']:.2f}", f"{lib.cpu_s:.2f}",
                     f"{np.max(np.abs(lib.losses - used)):.2e}", f"{np.corrcoef(lib.losses, used)[0, 1]:.6f}"])
    text = "\n".join([
        "# IL models: the runs' `fit_il` against the library's `fit_irreducible` (information only)", "",
        "Command: `python -m experiments.selection_il_check`. Same data, split, seed, steps and checkpoint interval; "
        "the checkpoint chosen on the held-out slice of the hold-out split in both. CPU seconds of each fit as "
        "measured in its own process (the runs' cost is the `fit_il` one, in `il-<variant>.json`).", "",
        *S_table(["IL", "fit_il: held-out acc @ step", "fit_irreducible: held-out acc @ step", "fit_il CPU s",
                  "fit_irreducible CPU s", "max |loss difference|", "loss correlation"], rows), ""])
    args.out.write_text(text)
    print(text)


def S_table(header, rows):
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |"
                                                                           for r in rows]


if __name__ == "__main__":
    main()
