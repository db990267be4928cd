"""Tables and figure of the fair mixing test (issue 40) from its committed records alone.

    python -m experiments.mixing_fair_summary            # prints, and writes results/mixing_fair/summary.md + .png

Protocol: results/mixing_fair/protocol.md. The paired statistics and Holm's adjustment are issue 29's
(`experiments/mixing_lm_summary.py`), reused.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from experiments.mixing_lm_summary import holm, load, paired

RESULTS = Path(__file__).resolve().parents[1] / "results" / "mixing_fair"
ARMS = ("stratified", "odm", "ado", "natural")
SEEDS = (0, 1, 2, 3, 4)
STEPS = 6000


def at_cpu(rec: dict, budget: float) -> float:
    """Mean held-out perplexity at ``budget`` training CPU seconds, linear between evaluations (the first
    evaluation at 0 s; a budget past the run's last evaluation takes the last)."""
    cpu = np.array([e["train_cpu_s"] for e in rec["evals"]])
    ppl = np.array([e["mean_ppl"] for e in rec["evals"]])
    return float(np.interp(budget, cpu, ppl))


def equal_cpu(recs: dict, arm: str, base: str = "stratified") -> dict | None:
    """``arm`` − ``base`` at T = the smaller of each pair's total training CPU seconds."""
    seeds = sorted(set(recs.get(arm, {})) & set(recs.get(base, {})))
    budgets = {s: min(recs[arm][s]["timing"]["train_cpu_s"], recs[base][s]["timing"]["train_cpu_s"]) for s in seeds}
    view = {arm: {s: {"v": at_cpu(recs[arm][s], budgets[s])} for s in seeds},
            base: {s: {"v": at_cpu(recs[base][s], budgets[s])} for s in seeds}}
    return paired(view, arm, base, lambda r: r["v"])


def line(name: str, r: dict | None, p_adj: float | None = None) -> str:
    if r is None:
        return f"| {name} | fewer than 2 pairs | | | |"
    adj = "" if p_adj is None else f"{p_adj:.4f}"
    return (f"| {name} (n={r['n']}) | {r['mean']:+.2f} [{r['lo']:+.2f}, {r['hi']:+.2f}] | {r['p']:.4f} | {adj} | "
            f"{int((r['diff'] < 0).sum())} of {r['n']} |")


def summarize(recs: dict) -> str:
    final = lambda r: r["final"]["mean_ppl"]  # noqa: E731
    worst = lambda r: r["final"]["worst_ppl"]  # noqa: E731
    primary = paired(recs, "odm", "stratified", final)
    secondary = [("ado − stratified, mean ppl @ 6,000", paired(recs, "ado", "stratified", final)),
                 ("natural − stratified, mean ppl @ 6,000", paired(recs, "natural", "stratified", final)),
                 ("odm − stratified, worst-source ppl @ 6,000", paired(recs, "odm", "stratified", worst)),
                 ("odm − stratified, mean ppl at equal training CPU", equal_cpu(recs, "odm"))]
    done = [(n, r) for n, r in secondary if r is not None]
    # Holm over the family of 4 fixed in the protocol; while some are missing, Bonferroni's min(1, 4p), an upper
    # bound of the Holm p each comparison will get whatever the missing ones give.
    if len(done) == len(secondary):
        adjusted = dict(zip([n for n, _ in done], holm([r["p"] for _, r in done])))
    else:
        adjusted = {n: min(1.0, len(secondary) * r["p"]) for n, r in done}
    complete = primary is not None and primary["n"] == len(SEEDS)
    out = ["# The fair mixing test (issue 40): results", "",
           "Protocol: `results/mixing_fair/protocol.md`. Recompute: `python -m experiments.mixing_fair_summary`. "
           "Differences are paired by seed (mean, paired-t 95% CI, two-sided p); negative = lower perplexity "
           "than stratified. Holm p: over the 4 secondaries of the protocol; while some are still missing, "
           "min(1, 4p), an upper bound of the Holm p each will get.", "",
           f"Records: " + ", ".join(f"{a} {len(recs.get(a, {}))}" for a in ARMS) + f" of {len(SEEDS)} seeds each."
           + ("" if complete else " **Partial: no verdict.**"), "",
           "| comparison | difference | p | Holm p | pairs lower |", "|---|---|---|---|---|",
           line("**primary:** odm − stratified, mean ppl @ 6,000", primary)]
    out += [line(n, r, adjusted.get(n)) for n, r in secondary]
    ado_cpu = equal_cpu(recs, "ado")
    out += [line("ado − stratified at equal training CPU (descriptive)", ado_cpu), ""]
    out += ["## Per arm (mean over seeds)", "",
            "| arm | runs | mean ppl @ 6,000 | worst ppl | train CPU s | mixing share of step CPU | final weights |",
            "|---|---|---|---|---|---|---|"]
    for arm in ARMS:
        rs = list(recs.get(arm, {}).values())
        if not rs:
            continue
        weights = np.mean([r["weights"][-1]["weights"] for r in rs], axis=0)
        out.append(f"| {arm} | {len(rs)} | {np.mean([final(r) for r in rs]):.2f} | {np.mean([worst(r) for r in rs]):.2f} "
                   f"| {np.mean([r['timing']['train_cpu_s'] for r in rs]):.0f} | "
                   f"{np.mean([r['timing']['mixing_frac_of_step_cpu'] for r in rs]):.3%} | "
                   f"{' / '.join(f'{w:.3f}' for w in weights)} |")
    out.append("")
    return "\n".join(out)


def figure(recs: dict, path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    arms = [a for a in ("odm", "ado") if recs.get(a)]
    if not arms:
        return False
    fig, axes = plt.subplots(1, len(arms), figsize=(6 * len(arms), 4), squeeze=False)
    for ax, arm in zip(axes[0], arms):
        rs = list(recs[arm].values())
        steps = [w["step"] for w in rs[0]["weights"]]
        mean = np.mean([[w["weights"] for w in r["weights"]] for r in rs], axis=0)
        for k, name in enumerate(rs[0]["sources"]):
            ax.plot(steps, mean[:, k], label=name)
        ax.set_title(f"{arm}: weight per source (mean of {len(rs)} seeds)")
        ax.set_xlabel("step")
        ax.set_ylim(0, None)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=RESULTS / "runs")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    recs = load(args.runs)
    text = summarize(recs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.md").write_text(text + "\n")
    figure(recs, args.out / "weights.png")
    print(text)


if __name__ == "__main__":
    main()
