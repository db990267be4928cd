"""ADO (replayloader.mixing.ado) against a numpy reference written here from the authors' released code
(yidingjiang/ado, src/data_selectors/ado.py: AdoSelector.update, AdoSelector.curr_dist,
compute_scaling_law_params, loss_fn, huber_loss, scaling_law, clip_min_probability); its fit against scipy; a
behaviour test; its argument and state checks."""
import numpy as np
import pytest
from hypothesis import HealthCheck
from hypothesis import given, settings, strategies as st

from replayloader import InvalidState
from replayloader.mixing import MixingRule, MixtureSampler
from replayloader.mixing import ado as ado_module
from replayloader.mixing.ado import ADO, fit_objective, fit_scaling_laws, savgol_smooth, start_grid

scipy_signal = pytest.importorskip("scipy.signal")
scipy_optimize = pytest.importorskip("scipy.optimize")


# ----------------------------------------------------------------------------- the reference
def reference_clip_min_probability(probs, min_prob):
    """clip_min_probability: rescale by the total deficit, raise every entry to min_prob, renormalise."""
    total_deficit = max(min_prob * len(probs) - probs.sum(), 0)
    scaled = probs * ((1 - total_deficit) / probs.sum())
    clipped = np.maximum(scaled, min_prob)
    return clipped / clipped.sum()


class ReferenceADO:
    """AdoSelector with use_same_step_size=True and y_axis="train_loss", step by step as released: arrays grown
    with np.append, scipy's savgol_filter, the exponent floor 0.05, p = 0.9 p_avg + 0.1 dist. The scaling-law fit
    is passed in (``fit(x, y)``; `fit_scaling_laws` is tested against scipy below). One guard the released
    code lacks (it would raise in savgol_filter, or divide by a zero sum): a fit with fewer steps than the
    window or none past ignore_steps is skipped, and a zero slope sum keeps the distribution."""

    def __init__(self, k, prior, ignore_steps, start_step, update_interval, window, stride, min_prob, fit):
        self.k, self.ignore_steps, self.start_step, self.update_interval = k, ignore_steps, start_step, update_interval
        self.window, self.stride, self.min_prob, self.fit = window, stride, min_prob, fit
        self.empirical_dist = np.array(prior, dtype=np.float64)
        self.p = self.p_avg = self.p_history = self.empirical_dist
        self.task_cnt_TxK = np.empty((0, k), dtype=np.int64)
        self.task_loss_TxK = np.empty((0, k))
        self.current_params = None

    def update(self, losses_K, counts_K, itr):
        """AdoSelector.update from per-source means: the batch mean loss is the count-weighted mean."""
        self.task_cnt_TxK = np.append(self.task_cnt_TxK, np.ones((1, self.k), np.int64) * counts_K.sum(), axis=0)
        count_dist = counts_K / counts_K.sum()
        self.p_history = 0.9 * self.p_history + 0.1 * count_dist
        avg_loss = (losses_K * counts_K).sum() / counts_K.sum()
        task_loss_K = np.zeros(self.k)
        for i in range(self.k):
            if counts_K[i] > 0:
                task_loss_K[i] = losses_K[i]
            elif self.task_loss_TxK.shape[0] > 0:
                task_loss_K[i] = self.task_loss_TxK[-1, i]
            else:
                task_loss_K[i] = avg_loss
        self.task_loss_TxK = np.append(self.task_loss_TxK, task_loss_K[None], axis=0)
        rows = self.task_loss_TxK.shape[0]
        if itr >= self.start_step and itr % self.update_interval == 0 and rows >= self.window \
                and rows > self.ignore_steps:
            cum_cnt_TxK = np.cumsum(self.task_cnt_TxK, 0)
            x = cum_cnt_TxK[self.ignore_steps::self.stride, 0]
            smoothed = scipy_signal.savgol_filter(self.task_loss_TxK.T, self.window, 3, axis=-1)
            y = smoothed[:, self.ignore_steps::self.stride]
            params = self.fit(x, y)
            if not (np.isnan(params).any() or np.isinf(params).any()):
                self.current_params = params

    def curr_dist(self, itr):
        if itr < self.start_step or self.current_params is None:
            return None
        a, e, alpha = self.current_params.T
        irred_loss_K = np.exp(e)
        expnt_K = np.maximum(alpha, 0.05)
        n_seen_K = np.float64(np.sum(self.task_cnt_TxK, 0))
        curr_loss_K = np.exp(e) + np.exp(a) / n_seen_K ** alpha
        slope_K = expnt_K * (curr_loss_K - irred_loss_K) / n_seen_K
        weighted = slope_K * self.empirical_dist * (self.p_history * (1 - self.p_history)) ** 0.5
        if not weighted.sum() > 0:
            return None
        dist_K = reference_clip_min_probability(weighted / weighted.sum(), self.min_prob)
        self.p = 0.9 * self.p_avg + 0.1 * dist_K
        self.p_avg = (1 - 1 / (itr + 1)) * self.p_avg + 1 / (itr + 1) * dist_K
        return self.p


def loss_stream(k, seed, batch=12):
    """Per step: counts drawn from the weights given, losses a noisy power law per source in its own examples
    (sources not drawn: loss 0.0, count 0)."""
    rng = np.random.default_rng(seed)
    floor, scale, rate = 1.5 + rng.random(k) * 2, rng.random(k) * 6, rng.random(k) * 0.6
    seen = np.zeros(k)

    def step(weights):
        counts = rng.multinomial(batch, weights)
        seen[:] += counts
        mean = floor + scale * (seen + 1.0) ** -rate
        losses = mean * np.exp(rng.normal(0, 0.05, k) / np.sqrt(np.maximum(counts, 1)))
        return np.where(counts > 0, losses, 0.0), counts
    return step


# ----------------------------------------------------------------------------- step by step
class FitSpy:
    """Stands in for the rule's `fit_scaling_laws` and records each call. The reference's fit then checks that
    its own inputs (scipy's smoothing of its own loss table) equal the rule's, and returns the rule's fit: the
    optimizer amplifies a 1e-15 difference in its input, so both must see the same bits."""

    def __init__(self):
        self.calls = []

    def __call__(self, x, y):
        params = fit_scaling_laws(x, y)
        self.calls.append((x, y, params))
        return params

    def reference_fit(self, x, y):
        rule_x, rule_y, params = self.calls.pop(0)
        np.testing.assert_array_equal(rule_x, x)
        np.testing.assert_allclose(rule_y, y, rtol=1e-10, atol=1e-12)
        return params


@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(k=st.integers(2, 4), seed=st.integers(0, 2**16), ignore=st.integers(0, 20), start=st.integers(0, 25),
       interval=st.integers(6, 20), window=st.sampled_from([5, 7, 9]), stride=st.integers(1, 3),
       min_weight=st.sampled_from([0.0, 0.01, 0.1]), natural=st.booleans())
def test_ado_matches_the_numpy_reference_step_by_step(monkeypatch, k, seed, ignore, start, interval, window, stride,
                                                     min_weight, natural):
    spy = FitSpy()
    monkeypatch.setattr(ado_module, "fit_scaling_laws", spy)
    prior = np.random.default_rng(seed).dirichlet(np.ones(k)) if natural else np.full(k, 1 / k)
    rule = ADO(k, prior=prior, warmup=ignore, start_step=start, update_interval=interval,
               smoothing_window=window, fit_stride=stride, min_weight=min_weight)
    ref = ReferenceADO(k, prior, ignore, start, interval, window, stride, min_weight, spy.reference_fit)
    step, moved = loss_stream(k, seed), 0
    for itr in range(60):
        np.testing.assert_allclose(rule.weights(), ref.p, rtol=1e-9, atol=1e-12)
        losses, counts = step(rule.weights())
        rule.feedback(losses, counts)
        ref.update(losses, counts, itr)
        moved += ref.curr_dist(itr) is not None
        assert not spy.calls  # the rule fitted exactly when the reference did
    np.testing.assert_allclose(rule.weights(), ref.p, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(rule.average, ref.p_avg, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(rule.history, ref.p_history, rtol=1e-12)
    np.testing.assert_array_equal(rule.state_dict()["losses"], ref.task_loss_TxK)
    assert rule.examples_seen == ref.task_cnt_TxK[:, 0].sum() and rule.t == 60
    if ref.current_params is None:
        assert rule.params is None
    else:
        np.testing.assert_allclose(rule.params, ref.current_params, rtol=1e-9, atol=1e-12)
    assert moved > 0 and not np.allclose(rule.weights(), prior)  # a law was fitted and the weights moved


# ----------------------------------------------------------------------------- the pieces
@pytest.mark.parametrize("length, window", [(5, 5), (6, 5), (40, 11), (300, 101), (101, 101)])
def test_savgol_smooth_is_scipys_savgol_filter(length, window):
    x = np.random.default_rng(length).normal(size=(3, length)).cumsum(axis=1)
    np.testing.assert_allclose(savgol_smooth(x, window), scipy_signal.savgol_filter(x, window, 3, axis=-1),
                               rtol=1e-10, atol=1e-10)


def reference_objective(params, log_n, log_l):
    """loss_fn: sum of huber(log L, logsumexp(a − α log n, e); δ = 1e-3) plus the soft bounds."""
    a, e, alpha = params
    pred = np.logaddexp(a - alpha * log_n, e)
    diff = np.abs(log_l - pred)
    huber = np.where(diff > 1e-3, 1e-3 * (diff - 0.5e-3), 0.5 * diff ** 2)
    return (huber.sum() + max(alpha - 0.8, 0) - min(alpha, 0.001) + max(a - 6.5, 0) - min(e - 0.5, 0))


def test_fit_objective_is_the_authors_loss_fn_and_its_gradient():
    rng = np.random.default_rng(3)
    log_n = np.log(np.linspace(1e3, 1e5, 80))
    log_l = np.log(2.0 + 5.0 * np.exp(log_n) ** -0.3) + rng.normal(0, 0.01, 80)
    params = np.column_stack([rng.uniform(-2, 7, 40), rng.uniform(-2, 2, 40), rng.uniform(-0.2, 1.0, 40)])
    value, grad = fit_objective(params, log_n, log_l)
    np.testing.assert_allclose(value, [reference_objective(p, log_n, log_l) for p in params], rtol=1e-12)
    for j in range(3):
        bump = np.zeros(3)
        bump[j] = 1e-7
        numeric = [(reference_objective(p + bump, log_n, log_l) - reference_objective(p - bump, log_n, log_l)) / 2e-7
                   for p in params]
        np.testing.assert_allclose(grad[:, j], numeric, rtol=1e-4, atol=1e-6)
    assert start_grid().shape == (512, 3)


def test_fit_recovers_an_exact_power_law():
    n = np.geomspace(1e4, 1e6, 120)
    losses = np.stack([2.0 + 6.0 * n ** -0.3, 2.5 + 20.0 * n ** -0.5])
    params = fit_scaling_laws(n, losses)
    expected = [[np.log(6.0), np.log(2.0), 0.3], [np.log(20.0), np.log(2.5), 0.5]]  # (log A, log E, α)
    np.testing.assert_allclose(params, expected, atol=2e-3)


def test_fit_reaches_the_minimum_scipy_finds_from_the_same_starts():
    """scipy's L-BFGS-B from every 32nd start of the same grid: our fit from all 512 is as low, and on this
    identifiable law it lands on the same parameters."""
    rng = np.random.default_rng(0)
    n = 16.0 * np.arange(1000, 4000, 10)
    loss = 2.2 + 6.0 * n ** -0.3 + rng.normal(0, 0.01, len(n))
    ours = fit_scaling_laws(n, loss[None])[0]
    log_n, log_l = np.log(n), np.log(loss)

    def fun(p):
        value, grad = fit_objective(p[None], log_n, log_l)
        return value[0], grad[0]
    best = min((scipy_optimize.minimize(fun, x0, jac=True, method="L-BFGS-B",
                                        options={"maxiter": 200, "gtol": 1e-5}) for x0 in start_grid()[::32]),
               key=lambda r: r.fun)
    assert fun(ours)[0] <= best.fun + 1e-9
    np.testing.assert_allclose(ours, best.x, atol=1e-3)


def test_step_scale_multiplies_every_step_count():
    assert ADO(2).steps == {"warmup": 1000, "start_step": 500, "update_interval": 1000, "smoothing_window": 101,
                            "fit_stride": 10}
    assert ADO(2, step_scale=0.1).steps == {"warmup": 100, "start_step": 50, "update_interval": 100,
                                            "smoothing_window": 11, "fit_stride": 1}
    assert ADO(2, step_scale=0.01).steps == {"warmup": 10, "start_step": 5, "update_interval": 10,
                                             "smoothing_window": 5, "fit_stride": 1}


# ----------------------------------------------------------------------------- behaviour
BEHAVIOUR_STEPS = 400  # at step_scale=0.05: fits every 50 steps from step 50; seed 0 crosses 2/K at step ~220


def test_a_source_still_learning_passes_2_over_k_within_400_steps():
    """K = 4, 32 examples a step, step_scale=0.05. Source 0's loss falls as 2 + 8·(m + 32)^−0.4 in its own
    examples m (a large reducible part); source 1 is learned (flat 1.8), source 2 pure noise (mean 4.0, sd 0.5),
    source 3 flat at 3.0. Source 0's weight passes 2/K = 0.5 within BEHAVIOUR_STEPS = 400 steps."""
    rng = np.random.default_rng(0)
    rule, k, batch = ADO(4, step_scale=0.05), 4, 32
    seen, crossed = np.zeros(k), None
    for t in range(BEHAVIOUR_STEPS):
        counts = rng.multinomial(batch, rule.weights())
        seen += counts
        mean = np.array([2.0 + 8.0 * (seen[0] + batch) ** -0.4, 1.8, 4.0, 3.0])
        noise = np.array([0.05, 0.02, 0.5, 0.05]) / np.sqrt(np.maximum(counts, 1))
        losses = np.where(counts > 0, np.maximum(mean + rng.normal(0, noise), 0.05), 0.0)
        rule.feedback(losses, counts)
        if rule.weights()[0] > 2 / k:
            crossed = t
            break
    assert crossed is not None, f"weights after {BEHAVIOUR_STEPS} steps: {rule.weights()}"
    assert rule.estimates()["reducible"][0] > 0.1


def test_weights_are_the_prior_until_the_first_law_and_one_source_keeps_weight_one():
    rule = ADO(prior=[0.2, 0.8], step_scale=0.01)
    assert rule.num_sources == 2 and rule.estimates() == {}
    for _ in range(5):
        rule.feedback(np.array([3.0, 2.0]), np.array([2, 6]))
        np.testing.assert_array_equal(rule.weights(), [0.2, 0.8])
    single = ADO(step_scale=0.01)
    single.bind(1)
    for t in range(30):
        single.feedback(np.array([3.0 / (t + 1) ** 0.3]), np.array([4]))
        np.testing.assert_array_equal(single.weights(), [1.0])


def test_ado_is_a_mixing_rule_and_runs_in_the_sampler():
    rule = ADO(step_scale=0.01)
    assert isinstance(rule, MixingRule)
    sampler = MixtureSampler([40, 40, 40], batch_size=12, rule=rule, seed=1)
    for t in range(25):
        batch = sampler.next_batch()
        sampler.feedback(batch.indices, loss=1.0 + batch.sources + 3.0 * (batch.sources == 0) / (t + 1) ** 0.5)
    assert rule.num_sources == 3 and rule.params is not None and rule.t == 25
    w = rule.weights()
    assert abs(w.sum() - 1) < 1e-12 and (w >= 0).all()
    with pytest.raises(ValueError, match="built for 3 sources but the sampler has 2"):
        rule.bind(2)


# ----------------------------------------------------------------------------- state
def run(rule, steps, seed):
    step = loss_stream(rule.num_sources, seed)
    for _ in range(steps):
        rule.feedback(*step(rule.weights()))


def test_state_round_trip_resumes_exactly():
    rule = ADO(3, step_scale=0.02)
    run(rule, 70, seed=5)
    assert rule.params is not None
    again = ADO(3, step_scale=0.02)
    again.load_state_dict(rule.state_dict())
    np.testing.assert_array_equal(again.weights(), rule.weights())
    for r in (rule, again):
        run(r, 45, seed=9)
    np.testing.assert_array_equal(again.weights(), rule.weights())
    np.testing.assert_array_equal(again.params, rule.params)
    assert again.t == rule.t == 115 and again.examples_seen == rule.examples_seen


def test_a_refused_state_leaves_the_rule_unchanged():
    source = ADO(2, step_scale=0.02)
    run(source, 50, seed=1)
    good = source.state_dict()
    target = ADO(2, step_scale=0.02)
    run(target, 30, seed=2)
    before = repr(target.state_dict())
    bad_states = [
        ({**good, "losses": good["losses"][:-1]}, "shape"),
        ({**good, "losses": -good["losses"]}, "finite and > 0"),
        ({**good, "totals": np.zeros_like(good["totals"])}, ">= 1"),
        ({**good, "history": np.array([0.7, 0.7])}, "sum to 1"),
        ({**good, "current": np.array([np.nan, 1.0])}, "current"),
        ({**good, "params": np.zeros((1, 3))}, "params"),
        ({**good, "params": np.full((2, 3), np.inf)}, "params"),
        ({**good, "t": -1}, "'t'"),
        ({**good, "config": {**good["config"], "step_scale": 0.5}}, "step_scale=0.5"),
        ({**good, "version": 9}, "version"),
        ([1, 2], "mapping"),
    ]
    for bad, message in bad_states:
        with pytest.raises(InvalidState, match=message):
            target.load_state_dict(bad)
        assert repr(target.state_dict()) == before


# ----------------------------------------------------------------------------- argument checks
@pytest.mark.parametrize("kwargs, name", [
    ({"num_sources": 0}, "num_sources"),
    ({"warmup": -1}, "warmup"),
    ({"start_step": 1.5}, "start_step"),
    ({"update_interval": 0}, "update_interval"),
    ({"smoothing_window": 3}, "smoothing_window"),
    ({"smoothing_window": 6}, "smoothing_window must be odd"),
    ({"fit_stride": 0}, "fit_stride"),
    ({"step_scale": 0}, "step_scale"),
    ({"step_scale": float("nan")}, "step_scale"),
    ({"min_weight": -0.1}, "min_weight"),
    ({"num_sources": 4, "min_weight": 0.3}, "min_weight must be <= 1/K"),
    ({"prior": [0.5, 0.6]}, "prior must sum to 1"),
    ({"num_sources": 3, "prior": [0.5, 0.5]}, "prior must have num_sources = 3"),
])
def test_bad_arguments_raise_value_errors_naming_them(kwargs, name):
    with pytest.raises(ValueError, match=name):
        ADO(**kwargs)


@pytest.mark.parametrize("losses, counts, message", [
    ([1.0, float("nan"), 1.0], [1, 1, 1], r"source_losses\[1\]"),
    ([1.0, -0.5, 1.0], [1, 1, 1], r"source_losses must be > 0 for a seen source.*source_losses\[1\] = -0.5"),
    ([1.0, 0.0, 1.0], [1, 1, 1], r"source_losses\[1\] = 0.0"),
    ([1.0, 1.0], [1, 1], "shape"),
    ([1.0, 1.0, 1.0], [0, 0, 0], "at least one"),
])
def test_bad_feedback_raises_and_changes_nothing(losses, counts, message):
    rule = ADO(3, step_scale=0.01)
    rule.feedback(np.array([1.0, 0.0, 3.0]), np.array([2, 0, 1]))  # an unseen source's 0.0 is fine
    before = repr(rule.state_dict())
    with pytest.raises(ValueError, match=message):
        rule.feedback(np.array(losses), np.array(counts))
    assert repr(rule.state_dict()) == before
    with pytest.raises(ValueError, match="min_weight must be <= 1/K"):
        ADO(min_weight=0.4).bind(3)
