"""ADO, Adaptive Data Optimization (Jiang, Zhou, Feng, Ye, Kolter & Raghunathan, ICLR 2025): each source's
training loss is fitted online with a scaling law, and the mixture favours the sources whose fitted loss is
still falling fastest.

Written from the authors' released code, github.com/yidingjiang/ado, file ``src/data_selectors/ado.py``
(class ``AdoSelector``, methods ``update``, ``curr_dist`` and ``compute_scaling_law_params``; functions
``fit_scaling_law``, ``loss_fn``, ``huber_loss``, ``scaling_law`` and ``clip_min_probability``), with the
defaults of ``configs/loader/pile_ado.yaml`` and ``configs/experiment/124M_ado.yaml`` / ``1B_ado.yaml``. The
code here is our own, on the core dependencies only (numpy, numba: no jax, jaxopt or scipy); nothing is copied.
See `ADO` for the formulas and every deviation.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numba import njit

from .. import _checks as checks
from ..state.checks import array, check_header, integer, require
from .rules import SUM_TOLERANCE, _bind, _bound, losses_and_counts, proportions_vector

STATE_VERSION = 1

# The authors' constants (src/data_selectors/ado.py), none of them a step count.
HISTORY_DECAY = 0.9  # AdoSelector.update: p_history ← 0.9 · p_history + 0.1 · (this step's source shares)
AVERAGE_SHARE = 0.9  # AdoSelector.curr_dist: p = 0.9 · p_avg + 0.1 · dist
EXPONENT_FLOOR = 0.05  # AdoSelector.curr_dist: "arbitrarily bound exponent to be >= 0.05"
SMOOTHING_ORDER = 3  # compute_scaling_law_params: savgol_filter(losses, 101, 3)
HUBER_DELTA = 1e-3  # huber_loss(delta=1e-3), on log losses
LBFGS_MAXITER = 200  # fit_scaling_law: LBFGS(loss_fn, tol=1e-5, maxiter=200)
LBFGS_TOL = 1e-5
LBFGS_HISTORY = 10  # jaxopt.LBFGS's defaults: history_size=10, maxls=15
LBFGS_MAXLS = 15


def start_grid() -> np.ndarray:
    """The 512 starting points of every fit (``fit_scaling_law``): log A in -2..5 (step 1), log E in -2..1.5
    (step 0.5), α in 0..0.7 (step 0.1), all combinations, log A varying slowest."""
    a, e, alpha = np.meshgrid(np.arange(-2.0, 6.0, 1.0), np.arange(-2.0, 2.0, 0.5), np.arange(8) * 0.1,
                              indexing="ij")
    return np.stack([a.ravel(), e.ravel(), alpha.ravel()], axis=1)


def scaling_law(params: np.ndarray, examples: np.ndarray | float) -> np.ndarray:
    """L(n) = E + A / n^α for params rows (log A, log E, α) (``scaling_law``)."""
    params = np.asarray(params, dtype=np.float64)
    return np.exp(params[..., 1]) + np.exp(params[..., 0]) / np.power(examples, params[..., 2])


@njit(cache=True, nogil=True)
def _objective_kernel(params, source, log_examples, log_losses, value, grad):  # pragma: no cover - compiled
    """`fit_objective`'s value and gradient for every row of ``params`` (fitted to the losses of source
    ``source[row]``), one fused pass over the points."""
    for b in range(params.shape[0]):
        log_l = log_losses[source[b]]
        a, e, alpha = params[b, 0], params[b, 1], params[b, 2]
        total = 0.0
        g_a = 0.0
        g_e = 0.0
        g_alpha = 0.0
        for i in range(log_examples.shape[0]):
            u = a - alpha * log_examples[i] - e  # log of the reducible part over the irreducible
            if u > 0.0:
                ex = math.exp(-u)
                pred = a - alpha * log_examples[i] + math.log1p(ex)
                share = 1.0 / (1.0 + ex)  # d pred / d a
            else:
                ex = math.exp(u)
                pred = e + math.log1p(ex)
                share = ex / (1.0 + ex)
            resid = pred - log_l[i]
            size = abs(resid)
            if size > HUBER_DELTA:
                total += HUBER_DELTA * (size - 0.5 * HUBER_DELTA)
                slope = HUBER_DELTA if resid > 0.0 else -HUBER_DELTA
            else:
                total += 0.5 * resid * resid
                slope = resid
            g_a += slope * share
            g_e += slope * (1.0 - share)
            g_alpha -= slope * share * log_examples[i]
        # the soft bounds; at a kink JAX's max / min give each side half the gradient
        total += max(alpha - 0.8, 0.0) - min(alpha, 0.001) + max(a - 6.5, 0.0) - min(e - 0.5, 0.0)
        g_alpha += _kink(alpha, 0.8) - (1.0 - _kink(alpha, 0.001))
        g_a += _kink(a, 6.5)
        g_e -= 1.0 - _kink(e, 0.5)
        value[b] = total
        grad[b, 0] = g_a
        grad[b, 1] = g_e
        grad[b, 2] = g_alpha


@njit(cache=True, nogil=True)
def _kink(x, at):  # pragma: no cover - compiled
    """d max(x − at, 0) / dx, with 1/2 at x = at (JAX's convention)."""
    return 1.0 if x > at else (0.5 if x == at else 0.0)


def fit_objective(params: np.ndarray, log_examples: np.ndarray, log_losses: np.ndarray,
                  source: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The authors' fitting objective (``loss_fn`` with ``huber_loss``) and its gradient, for B rows at once.

    With θ = (a, e, α) = (log A, log E, α) and the log-space prediction p_i = log(exp(a − α·log n_i) + exp(e))
    over the N points (n_i, L_i), the objective is Σ_i huber(p_i − log L_i; δ = 1e-3) plus the soft bounds
    max(α − 0.8, 0) − min(α, 0.001) + max(a − 6.5, 0) − min(e − 0.5, 0). ``params`` is (B, 3) and
    ``log_examples`` (N,); ``log_losses`` is (N,), or (K, N) with ``source`` (B,) naming each row's source.
    Returns (B,) values and (B, 3) gradients.
    """
    params = np.ascontiguousarray(params, dtype=np.float64)
    log_losses = np.atleast_2d(np.asarray(log_losses, dtype=np.float64))
    source = np.zeros(len(params), np.int64) if source is None else np.asarray(source, dtype=np.int64)
    value, grad = np.empty(len(params)), np.empty_like(params)
    _objective_kernel(params, source, np.ascontiguousarray(log_examples, dtype=np.float64),
                      np.ascontiguousarray(log_losses), value, grad)
    return value, grad


def _lbfgs(fun: Any, x0: np.ndarray, maxiter: int, tol: float, history: int = LBFGS_HISTORY,
           armijo: float = 1e-4, max_tries: int = LBFGS_MAXLS) -> tuple[np.ndarray, np.ndarray]:
    """Minimise ``fun`` ((points, their row numbers) -> values, gradients) from every row of ``x0`` at once.

    L-BFGS as jaxopt's defaults have it where it matters: ``history`` pairs in the two-loop recursion, the
    initial inverse Hessian scaled by s·y / y·y of the newest pair, each line search starting from
    min(1.5 × the previous step, 1) and trying at most ``max_tries`` steps. The line search here backtracks
    (halving until the Armijo condition holds) where jaxopt zooms to the strong Wolfe conditions. A row stops
    when its gradient norm is <= ``tol`` or when no step tried decreases it. Returns the final rows and their
    values."""
    x = x0.astype(np.float64, copy=True)
    f, g = fun(x, np.arange(len(x)))
    b, d = x.shape
    s_hist, y_hist = np.zeros((history, b, d)), np.zeros((history, b, d))
    rho = np.zeros((history, b))
    gamma = np.ones(b)
    last_step = np.ones(b)
    active = np.isfinite(f) & (np.linalg.norm(g, axis=1) > tol)
    for it in range(maxiter):
        rows = np.flatnonzero(active)
        if not len(rows):
            break
        q = g[rows].copy()
        coef = np.zeros((history, len(rows)))
        order = [(it - 1 - j) % history for j in range(min(it, history))]  # newest first
        for j in order:
            coef[j] = rho[j, rows] * np.einsum("bd,bd->b", s_hist[j, rows], q)
            q -= coef[j][:, None] * y_hist[j, rows]
        r = gamma[rows][:, None] * q
        for j in reversed(order):
            beta = rho[j, rows] * np.einsum("bd,bd->b", y_hist[j, rows], r)
            r += s_hist[j, rows] * (coef[j] - beta)[:, None]
        direction = -r
        descent = np.einsum("bd,bd->b", direction, g[rows])
        bad = ~(np.isfinite(descent) & (descent < 0))
        direction[bad] = -g[rows][bad]
        descent[bad] = -np.einsum("bd,bd->b", g[rows][bad], g[rows][bad])
        new_x, new_f, new_g = x[rows].copy(), f[rows].copy(), g[rows].copy()
        moved = np.zeros(len(rows), dtype=bool)
        step = np.minimum(1.5 * last_step[rows], 1.0)
        pending = np.arange(len(rows))
        for _ in range(max_tries):
            trial = x[rows[pending]] + step[pending, None] * direction[pending]
            tf, tg = fun(trial, rows[pending])
            ok = np.isfinite(tf) & (tf <= f[rows[pending]] + armijo * step[pending] * descent[pending])
            done = pending[ok]
            new_x[done], new_f[done], new_g[done], moved[done] = trial[ok], tf[ok], tg[ok], True
            pending = pending[~ok]
            if not len(pending):
                break
            step[pending] *= 0.5
        s, y = new_x - x[rows], new_g - g[rows]
        sy, yy = np.einsum("bd,bd->b", s, y), np.einsum("bd,bd->b", y, y)
        curved = moved & (sy > 0) & (yy > 0)  # a pair without positive curvature is not kept
        slot = it % history
        s_hist[slot, rows], y_hist[slot, rows] = s, y
        rho[slot, rows] = np.where(curved, 1.0 / np.where(curved, sy, 1.0), 0.0)
        gamma[rows] = np.where(curved, sy / np.where(curved, yy, 1.0), gamma[rows])
        x[rows], f[rows], g[rows] = new_x, new_f, new_g
        last_step[rows] = np.where(moved, step, last_step[rows])
        active[rows] = moved & (np.linalg.norm(new_g, axis=1) > tol)
    return x, f


def fit_scaling_laws(examples: np.ndarray, losses: np.ndarray, *, maxiter: int = LBFGS_MAXITER,
                     tol: float = LBFGS_TOL) -> np.ndarray:
    """Per source, the (log A, log E, α) of L(n) = E + A / n^α fitted to ``losses`` (K, N) at ``examples``
    (N,) (``fit_scaling_law``): `fit_objective` minimised by L-BFGS from each of the 512 `start_grid` points,
    keeping the one with the lowest final objective (a NaN row where every start ended at NaN). All K × 512
    fits run as one batch. Returns (K, 3)."""
    log_examples = np.log(np.asarray(examples, dtype=np.float64))
    grid = start_grid()
    k = len(losses)
    with np.errstate(all="ignore"):
        log_losses = np.log(np.asarray(losses, dtype=np.float64))
        source = np.repeat(np.arange(k), len(grid))
        params, values = _lbfgs(lambda p, rows: fit_objective(p, log_examples, log_losses, source[rows]),
                                np.tile(grid, (k, 1)), maxiter, tol)
    params, values = params.reshape(k, len(grid), 3), values.reshape(k, len(grid))
    out = np.full((k, 3), np.nan)
    for i in range(k):
        if not np.isnan(values[i]).all():
            out[i] = params[i, np.nanargmin(values[i])]
    return out


def savgol_smooth(values: np.ndarray, window: int, order: int = SMOOTHING_ORDER) -> np.ndarray:
    """Savitzky–Golay smoothing along the last axis, as ``scipy.signal.savgol_filter(values, window, order)``
    with its default ``mode="interp"``: each point is the value at the window's centre of the least-squares
    polynomial of degree ``order`` over the ``window`` (odd) points around it; the first and last window // 2
    points take the polynomial fitted to the first (last) ``window`` points. Needs ``window`` <= the length."""
    values = np.asarray(values, dtype=np.float64)
    half = window // 2
    z = np.arange(-half, half + 1) / max(half, 1)
    vander = np.vander(z, order + 1, increasing=True)
    hat = vander @ np.linalg.pinv(vander)  # (window, window): row i evaluates the fit at point i
    out = np.empty_like(values)
    windows = np.lib.stride_tricks.sliding_window_view(values, window, axis=-1)
    out[..., half:values.shape[-1] - half] = windows @ hat[half]
    out[..., :half] = values[..., :window] @ hat[:half].T
    out[..., values.shape[-1] - half:] = values[..., -window:] @ hat[half + 1:].T
    return out


def floor_weights(weights: np.ndarray, floor: float) -> np.ndarray:
    """Every weight raised to at least ``floor``, then renormalised (``clip_min_probability``)."""
    deficit = max(floor * len(weights) - weights.sum(), 0.0)
    clipped = np.maximum(weights * ((1.0 - deficit) / weights.sum()), floor)
    return clipped / clipped.sum()


def _scaled(value: int, scale: float, low: int) -> int:
    return max(low, int(math.floor(value * scale + 0.5)))


class ADO:
    """Adaptive Data Optimization (Jiang et al., ICLR 2025), as the authors released it: a scaling law per
    source, fitted online to its training loss, and weights that follow each law's current slope.

    Bookkeeping, per `feedback` step t = 0, 1, … (``AdoSelector.update``), with c_k the examples of source k
    in the step and r_k their mean loss:

        n_t = Σ_{s<=t} Σ_k c_k(s)                          every source's x-axis: all examples seen so far
        ℓ_k(t) = r_k, or ℓ_k(t−1) when c_k = 0 (the count-weighted mean loss when t = 0)
        h ← 0.9 · h + 0.1 · c / Σc                          (h starts at the prior π⁰)

    Fit, at every step t >= ``start_step`` with t % ``update_interval`` == 0 (``compute_scaling_law_params``):
    the losses are Savitzky–Golay smoothed (window ``smoothing_window``, degree 3), and from step ``warmup``
    on every ``fit_stride``-th point is fitted per source with L_k(n) = E_k + A_k / n^α_k
    (`fit_scaling_laws`). A fit with a NaN or infinite parameter for any source is discarded (all sources
    keep their previous law).

    Weights, once a law exists, after every step t >= ``start_step`` (``curr_dist``):

        slope_k = max(α_k, 0.05) · (L_k(n_t) − E_k) / n_t            (−dL_k/dn, the exponent floored)
        d = floor(slope ⊙ π⁰ ⊙ sqrt(h ⊙ (1 − h)) / Σ(…), min_weight)  (floor: `floor_weights`)
        π = 0.9 · p̄ + 0.1 · d;   p̄ ← (1 − 1/(t+1)) · p̄ + d / (t+1)     (p̄ starts at π⁰)

    so p̄ is the running mean of every step's target, π⁰ counted for the steps before the first law.
    Before the first law the weights are π⁰.

    Defaults are the authors' Pile runs: ``warmup`` (their ``ignore_steps``) 1000, ``start_step`` 500,
    ``update_interval`` 1000, ``smoothing_window`` 101, ``fit_stride`` 10, ``min_weight`` 0.01, so the first law
    is fitted at step 1000, on one point, and refitted every 1000 steps of a 60,000-step run. ``step_scale``
    multiplies all five step counts (rounded; at least 1 for the interval and stride, the window odd and
    >= 5): ``step_scale=0.1`` runs the same schedule in a 6,000-step run.

    A limit of the released fit, kept: its soft bound −min(log E − 0.5, 0) holds the irreducible loss E at
    e^0.5 ≈ 1.65 nats or more (made for language-model losses). A source whose loss falls below that is fitted
    badly (E pinned at 1.65, the reducible part near 0) and gets little weight even while it is still learning.

    Deviations, stated:

    - The fit is our L-BFGS (numpy, with a numba kernel for the objective) from the same 512 starts, with
      jaxopt's history 10, at most 200 iterations, tolerance 1e-5 and at most 15 line-search tries, keeping
      the lowest final objective; the authors run jaxopt's ``LBFGS`` on accelerators, whose line search zooms
      to the strong Wolfe conditions where ours backtracks to the Armijo condition. On an identifiable law
      both find the same minimum (tested against scipy's L-BFGS-B); where the law is not identified (a flat
      loss: any split of its level into E and a reducible part with α ≈ 0 fits) the optimizers may pick
      different laws, and with the exponent floored at 0.05 such a split gives a flat source a slope. Cost:
      about 1–2 ms of CPU per fitted point per source per fit (2 cores), i.e. seconds per source per fit once
      thousands of points are fitted; ``fit_stride`` trades points for time.
    - The state holds the fitted laws, so a resumed run continues exactly; the authors refit on reload.
    - A scheduled fit that their code cannot do (fewer steps than the smoothing window, or none past
      ``warmup``) is skipped; a step whose slope sum is not positive and finite (e.g. K = 1) keeps the weights.
    - Train loss only (their ``y_axis="val_loss"`` option is not offered); their token-budget bookkeeping
      (``tokens_remaining``, ``compression_so_far``) is only logged there and is dropped here.
    - The input is per-source mean losses and counts, which carry the same numbers as their per-example losses.
    - π⁰ (``prior``) defaults to uniform, their ``mode="uniform"``; their default ``mode="empirical"`` is
      ``prior = sizes / sizes.sum()`` (by tokens, or examples).
    - A seen source's loss must be > 0 (the law is fitted to log losses); the authors do not check.

    Args:
        num_sources: K; None (default) takes it from the prior or from the `MixtureSampler`.
        prior: π⁰, K numbers >= 0 summing to 1 (default uniform): the weights until the first law, the start
            of h and p̄, and a factor of every step's target.
        warmup: steps left out of every fit (default 1000).
        start_step: the first step whose fit (and weights) may be used (default 500).
        update_interval: steps between fits (default 1000).
        smoothing_window: the Savitzky–Golay window in steps, odd >= 5 (default 101).
        fit_stride: every how many steps a point is fitted (default 10).
        step_scale: > 0, the factor on the five step counts above (default 1.0).
        min_weight: the floor of each source's target, in [0, 1/K] (default 0.01).
    """

    def __init__(self, num_sources: int | None = None, *, prior: Sequence[float] | np.ndarray | None = None,
                 warmup: int = 1000, start_step: int = 500, update_interval: int = 1000,
                 smoothing_window: int = 101, fit_stride: int = 10, step_scale: float = 1.0,
                 min_weight: float = 0.01) -> None:
        self.num_sources = checks.optional_integer("num_sources", num_sources, 1)
        self.prior = None if prior is None else proportions_vector("prior", prior)
        if self.prior is not None:
            if self.num_sources is not None and len(self.prior) != self.num_sources:
                raise ValueError(f"prior must have num_sources = {self.num_sources} entries, got {len(self.prior)}")
            self.num_sources = len(self.prior)
        self.warmup = checks.integer("warmup", warmup, 0)
        self.start_step = checks.integer("start_step", start_step, 0)
        self.update_interval = checks.integer("update_interval", update_interval, 1)
        self.smoothing_window = checks.integer("smoothing_window", smoothing_window, SMOOTHING_ORDER + 2)
        if self.smoothing_window % 2 == 0:
            raise ValueError(f"smoothing_window must be odd, got {smoothing_window!r}")
        self.fit_stride = checks.integer("fit_stride", fit_stride, 1)
        self.step_scale = checks.number("step_scale", step_scale, 0.0, low_open=True)
        self.min_weight = checks.number("min_weight", min_weight, 0.0, 1.0)
        s = self.step_scale
        self.steps = {"warmup": _scaled(self.warmup, s, 0), "start_step": _scaled(self.start_step, s, 0),
                      "update_interval": _scaled(self.update_interval, s, 1),
                      "smoothing_window": _scaled(self.smoothing_window, s, SMOOTHING_ORDER + 2) | 1,
                      "fit_stride": _scaled(self.fit_stride, s, 1)}
        self.t = 0
        if self.num_sources is not None:
            self._start(self.num_sources)

    # ------------------------------------------------------------------ setup
    def _check_floor(self, k: int) -> None:
        if self.min_weight * k > 1.0 + 1e-12:
            raise ValueError(f"min_weight must be <= 1/K = {1.0 / k!r} for K = {k} sources, got {self.min_weight!r}")

    def _start(self, k: int) -> None:
        self._check_floor(k)
        prior = np.full(k, 1.0 / k) if self.prior is None else self.prior
        self._prior = prior.copy()
        self.history, self.average, self.current = prior.copy(), prior.copy(), prior.copy()
        self.params: np.ndarray | None = None
        self._losses = np.zeros((0, k))
        self._totals = np.zeros(0, dtype=np.int64)
        self._seen = 0
        self.t = 0

    def bind(self, num_sources: int) -> None:
        fresh = self.num_sources is None
        if fresh:
            self._check_floor(checks.integer("num_sources", num_sources, 1))
        _bind(self, num_sources)
        if fresh:
            self._start(self.num_sources)

    # ------------------------------------------------------------------ the rule
    def weights(self) -> np.ndarray:
        _bound(self)
        return self.current.copy()

    @property
    def examples_seen(self) -> int:
        """n: every example fed back so far, the x-axis of every source's law."""
        return self._seen

    def estimates(self) -> dict[str, np.ndarray]:
        """Per source, the current law at n = `examples_seen`: ``irreducible`` E, ``reducible`` A / n^α and
        ``exponent`` α (nothing before the first law)."""
        if self.params is None:
            return {}
        n = float(self.examples_seen)
        irreducible = np.exp(self.params[:, 1])
        return {"irreducible": irreducible, "reducible": scaling_law(self.params, n) - irreducible,
                "exponent": self.params[:, 2].copy()}

    def feedback(self, source_losses: np.ndarray, source_counts: np.ndarray) -> None:
        losses, counts = losses_and_counts(self, source_losses, source_counts)
        seen = counts > 0
        bad = np.flatnonzero(seen & (losses <= 0))
        if len(bad):
            raise ValueError(f"source_losses must be > 0 for a seen source (ADO fits log losses); "
                             f"source_losses[{bad[0]}] = {float(losses[bad[0]])!r}")
        t, k = self.t, len(counts)
        total = int(counts.sum())
        seen_total = self._seen + total
        history = HISTORY_DECAY * self.history + (1.0 - HISTORY_DECAY) * counts / total
        if t > 0:
            fill = self._losses[t - 1]
        else:
            fill = np.full(k, float(np.dot(counts, losses)) / total)
        row = np.where(seen, losses, fill)
        loss_rows, totals = self._append(row, total)
        params = self.params
        steps = self.steps
        if t >= steps["start_step"] and t % steps["update_interval"] == 0:
            fitted = self._fit(loss_rows[: t + 1], totals[: t + 1])
            if fitted is not None:
                params = fitted
        current, average = self.current, self.average
        if t >= steps["start_step"] and params is not None:
            target = self._target(params, seen_total, history)
            if target is not None:
                current = AVERAGE_SHARE * average + (1.0 - AVERAGE_SHARE) * target
                average = (1.0 - 1.0 / (t + 1)) * average + target / (t + 1)
        self._losses, self._totals, self._seen = loss_rows, totals, seen_total
        self.history, self.params, self.current, self.average = history, params, current, average
        self.t = t + 1

    def _append(self, row: np.ndarray, total: int) -> tuple[np.ndarray, np.ndarray]:
        """The loss and count buffers with step t's row written (grown by doubling; the rows past t unused)."""
        t = self.t
        losses, totals = self._losses, self._totals
        if t >= len(losses):
            size = max(64, 2 * len(losses))
            losses = np.concatenate([losses[:t], np.zeros((size - t, losses.shape[1]))])
            totals = np.concatenate([totals[:t], np.zeros(size - t, dtype=np.int64)])
        losses[t], totals[t] = row, total
        return losses, totals

    def _fit(self, losses: np.ndarray, totals: np.ndarray) -> np.ndarray | None:
        """The laws fitted to steps 0..t, or None when the fit cannot be done or gives a NaN / infinity."""
        window, warmup, stride = (self.steps[key] for key in ("smoothing_window", "warmup", "fit_stride"))
        if len(losses) < window or len(losses) <= warmup:
            return None
        smoothed = savgol_smooth(losses.T, window)[:, warmup::stride]
        examples = np.cumsum(totals)[warmup::stride]
        params = fit_scaling_laws(examples, smoothed)
        return params if bool(np.isfinite(params).all()) else None

    def _target(self, params: np.ndarray, n: int, history: np.ndarray) -> np.ndarray | None:
        """d: the floored, normalised slope target of one step (None when the slopes sum to 0 or overflow)."""
        with np.errstate(all="ignore"):
            irreducible = np.exp(params[:, 1])
            slope = np.maximum(params[:, 2], EXPONENT_FLOOR) * (scaling_law(params, float(n)) - irreducible) / n
            score = slope * self._prior * np.sqrt(history * (1.0 - history))
            total = score.sum()
            if not (np.isfinite(total) and total > 0):
                return None
            return floor_weights(score / total, self.min_weight)

    # ------------------------------------------------------------------ state
    def _config(self) -> dict:
        k = _bound(self)
        return {"rule": "ADO", "num_sources": k, "prior": self._prior.tolist(), "warmup": self.warmup,
                "start_step": self.start_step, "update_interval": self.update_interval,
                "smoothing_window": self.smoothing_window, "fit_stride": self.fit_stride,
                "step_scale": self.step_scale, "min_weight": self.min_weight}

    def state_dict(self) -> dict:
        t = self.t
        return {"version": STATE_VERSION, "config": self._config(), "t": t,
                "losses": self._losses[:t].copy(), "totals": self._totals[:t].copy(),
                "history": self.history.copy(), "average": self.average.copy(), "current": self.current.copy(),
                "params": np.zeros((0, 3)) if self.params is None else self.params.copy()}

    def load_state_dict(self, state: Mapping) -> None:
        where = check_header(state, STATE_VERSION, self._config(), "ADO")
        k = _bound(self)
        t = integer(state, "t", where, 0)
        losses = array(state, "losses", where, (t, k), "f", np.float64)
        require(bool((np.isfinite(losses) & (losses > 0)).all()), f"{where}['losses'] must be finite and > 0")
        totals = array(state, "totals", where, (t,), "iu", np.int64)
        require(bool((totals >= 1).all()), f"{where}['totals'] must be >= 1")
        dists = {}
        for key in ("history", "average", "current"):
            value = array(state, key, where, (k,), "f", np.float64)
            require(bool((np.isfinite(value) & (value >= 0)).all()) and abs(value.sum() - 1.0) <= SUM_TOLERANCE,
                    f"{where}[{key!r}] must be finite, >= 0 and sum to 1, got {value.tolist()}")
            dists[key] = value
        params = array(state, "params", where, (-1, 3), "f", np.float64)
        require(len(params) in (0, k) and bool(np.isfinite(params).all()),
                f"{where}['params'] must be finite with 0 rows (no law yet) or {k}, got shape {params.shape}")
        self._losses, self._totals, self._seen, self.t = losses, totals, int(totals.sum()), t
        self.history, self.average, self.current = dists["history"], dists["average"], dists["current"]
        self.params = params if len(params) else None
