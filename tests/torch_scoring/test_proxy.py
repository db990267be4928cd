"""ProxyScorer: it scores with one no-grad forward, learns from the rows the main model trained on (or the pool),
counts its cost, reports how well its ranking tracks the main model's, resumes exactly, and refuses bad input
without changing."""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from replayloader import InvalidState, PrioritizedSampler
from replayloader.selection import Selector, TopK
from replayloader.torch import CandidateBatchSampler, take_rows
from replayloader.torch.scoring import ProxyScorer, rank_correlation
from tests.torch_scoring.common import cross_entropy_rows, eval_scores, mlp, pools, problem

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_proxy(train_on="selected", seed=0, **kwargs):
    torch.manual_seed(seed)
    proxy = torch.nn.Linear(8, 3)  # much smaller than the main MLP
    optimizer = torch.optim.Adam(proxy.parameters(), lr=0.05)
    return ProxyScorer(proxy, optimizer, cross_entropy_rows, train_on=train_on, **kwargs)


@pytest.mark.parametrize("train_on", ["selected", "pool"])
def test_the_proxy_learns_a_fixed_problem(train_on):
    x, y = problem(n=512)
    scorer = make_proxy(train_on)
    start = float(eval_scores(scorer.model, (x, y)).mean())
    rng = np.random.default_rng(0)
    for pool in pools(30, seed=1):
        scorer.score(pool)
        trained = rng.choice(32, 8, replace=False)  # the rows the main model trained on (here: any 8)
        scorer.feedback(pool, positions=trained if train_on == "selected" else None)
    end = float(eval_scores(scorer.model, (x, y)).mean())
    assert end < 0.7 * start, (start, end)
    stats = scorer.stats()
    assert stats["pools"] == 30 and stats["steps"] == 30 and stats["score_rows"] == 30 * 32
    assert stats["train_rows"] == 30 * (8 if train_on == "selected" else 32)
    assert stats["forward_rows"] == stats["score_rows"] + stats["train_rows"]
    assert stats["seconds"] == pytest.approx(stats["score_s"] + stats["train_s"]) and stats["seconds"] > 0
    assert math.isnan(stats["rank_correlation"])  # no main losses given


def test_scores_are_the_proxys_eval_mode_losses_without_gradients_and_with_irreducible_the_reducible_loss():
    pool = pools(1)[0]
    torch.manual_seed(0)
    proxy = torch.nn.Sequential(torch.nn.Linear(8, 3), torch.nn.Dropout(0.5))
    optimizer = torch.optim.SGD(proxy.parameters(), lr=0.1)
    scorer = ProxyScorer(proxy, optimizer, cross_entropy_rows)
    scores = scorer.score(pool)
    assert not scores.requires_grad and proxy.training  # eval mode only while scoring
    assert torch.equal(scores, eval_scores(proxy, pool))
    irreducible = np.linspace(0.0, 1.0, 100)
    indices = np.arange(10, 42)
    reducible = ProxyScorer(proxy, optimizer, cross_entropy_rows, irreducible=irreducible).score(pool, indices)
    assert torch.allclose(reducible, scores - torch.as_tensor(irreducible[indices], dtype=scores.dtype))


def test_the_rank_correlation_reports_whether_the_proxy_tracks_the_main_model():
    pool = pools(1)[0]
    scorer = make_proxy()
    rows = np.arange(0, 32, 2)
    own = eval_scores(scorer.model, take_rows(pool, rows))  # the proxy's losses on the rows, before its step
    scorer.feedback(pool, positions=rows, main_losses=own * 3 + 1)  # same ranking, other scale
    assert scorer.stats()["rank_correlation_last"] == pytest.approx(1.0)
    own = eval_scores(scorer.model, take_rows(pool, rows))
    scorer.feedback(pool, positions=rows, main_losses=-own)
    stats = scorer.stats()
    assert stats["rank_correlation_last"] == pytest.approx(-1.0) and stats["rank_correlation"] == pytest.approx(0.0)
    assert stats["correlated_steps"] == 2


def test_rank_correlation_is_spearmans_with_ties():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for _ in range(20):
        a, b = rng.integers(0, 5, 30).astype(float), rng.normal(size=30)
        assert rank_correlation(a, b) == pytest.approx(scipy_stats.spearmanr(a, b).statistic)
    assert math.isnan(rank_correlation([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])) and math.isnan(rank_correlation([1.0], [2.0]))
    with pytest.raises(ValueError, match="same length"):
        rank_correlation([1.0, 2.0], [1.0])


def test_a_checkpoint_resumes_the_proxy_and_its_optimizer_exactly():
    data = pools(8, seed=2)
    whole = make_proxy()
    for pool in data:
        whole.feedback(pool, positions=np.arange(8))
    first = make_proxy()
    for pool in data[:5]:
        first.feedback(pool, positions=np.arange(8), main_losses=torch.arange(8.0))
    state = first.state_dict()
    resumed = make_proxy(seed=7)  # another start: the checkpoint decides
    resumed.load_state_dict(state)
    for pool in data[5:]:
        resumed.feedback(pool, positions=np.arange(8))
    assert all(torch.equal(p, q) for p, q in zip(resumed.model.parameters(), whole.model.parameters()))
    assert resumed.stats()["steps"] == 8 and resumed.stats()["correlated_steps"] == 5


def test_positions_by_position_is_1_0s_form_and_warns():
    """``feedback(candidates, *, positions=...)`` since 1.1 (one feedback shape: the batch, then keywords)."""
    new, old = make_proxy(), make_proxy()
    pool = pools(1)[0]
    new.feedback(pool, positions=np.arange(8))
    with pytest.warns(DeprecationWarning, match=r"ProxyScorer\.feedback\(\) .*use \.feedback\(candidates, positions=\.\.\.\)"):
        old.feedback(pool, np.arange(8))
    assert all(torch.equal(p, q) for p, q in zip(new.model.parameters(), old.model.parameters()))


def test_a_bad_checkpoint_raises_invalid_state_and_changes_nothing():
    scorer = make_proxy()
    scorer.feedback(pools(1)[0], positions=np.arange(8))
    before = copy.deepcopy(scorer.state_dict())
    other = make_proxy(train_on="pool").state_dict()
    mismatched = copy.deepcopy(before)
    mismatched["optimizer"]["param_groups"].append(copy.deepcopy(mismatched["optimizer"]["param_groups"][0]))
    for broken, error in ((other, "train_on"), ({**before, "model": {"weight": torch.zeros(2)}}, "model"),
                          ({**before, "counters": {"steps": 1}}, "counters"), (mismatched, "optimizer")):
        with pytest.raises(InvalidState, match=error):
            scorer.load_state_dict(broken)
        now = scorer.state_dict()
        assert all(torch.equal(now["model"][k], before["model"][k]) for k in before["model"])
        assert now["optimizer"]["state"].keys() == before["optimizer"]["state"].keys()
        assert now["counters"] == before["counters"]


def test_bad_arguments_name_themselves_and_change_nothing():
    proxy = torch.nn.Linear(8, 3)
    optimizer = torch.optim.SGD(proxy.parameters(), lr=0.1)
    with pytest.raises(TypeError, match="proxy_model"):
        ProxyScorer("proxy", optimizer, cross_entropy_rows)
    with pytest.raises(TypeError, match="optimizer"):
        ProxyScorer(proxy, "sgd", cross_entropy_rows)
    with pytest.raises(ValueError, match="optimizer must optimize proxy_model"):
        ProxyScorer(proxy, torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1), cross_entropy_rows)
    with pytest.raises(TypeError, match="loss_fn"):
        ProxyScorer(proxy, optimizer, "ce")
    with pytest.raises(ValueError, match="train_on"):
        ProxyScorer(proxy, optimizer, cross_entropy_rows, train_on="everything")
    with pytest.raises(ValueError, match="irreducible"):
        ProxyScorer(proxy, optimizer, cross_entropy_rows, irreducible=[0.0, float("nan")])
    with pytest.raises(ValueError, match="window"):
        ProxyScorer(proxy, optimizer, cross_entropy_rows, window=0)

    pool = pools(1)[0]
    scorer = ProxyScorer(proxy, optimizer, cross_entropy_rows, irreducible=np.zeros(100))
    weights = copy.deepcopy(proxy.state_dict())
    for call, error in ((lambda: scorer.feedback(pool, positions=np.array([0, 32])), "positions"),
                        (lambda: scorer.feedback(pool, positions=np.array([[0, 1]])), "positions"),
                        (lambda: scorer.feedback(pool), "positions"),
                        (lambda: scorer.feedback(pool, positions=np.arange(4), main_losses=np.ones(3)), "main_losses"),
                        (lambda: scorer.feedback(pool, positions=np.arange(4), main_losses=np.ones(4)), "indices"),
                        (lambda: scorer.feedback(pool, positions=np.arange(4), weights=np.ones(5)), "weights"),
                        (lambda: scorer.score(pool), "indices"),
                        (lambda: scorer.score(pool, np.arange(90, 122)), "indices"),
                        (lambda: scorer.score((torch.empty(0, 8), torch.empty(0, dtype=torch.long))), "candidates")):
        with pytest.raises(ValueError, match=error):
            call()
    bad_loss = ProxyScorer(proxy, optimizer, lambda m, batch: cross_entropy_rows(m, batch).mean())
    with pytest.raises(ValueError, match="loss_fn"):
        bad_loss.feedback(pool, positions=np.arange(4))
    nan_loss = ProxyScorer(proxy, optimizer, lambda m, batch: cross_entropy_rows(m, batch) * float("nan"))
    with pytest.raises(ValueError, match="non-finite"):
        nan_loss.feedback(pool, positions=np.arange(4))
    pool_scorer = ProxyScorer(proxy, optimizer, cross_entropy_rows, train_on="pool")
    with pytest.raises(ValueError, match="weights"):
        pool_scorer.feedback(pool, positions=np.arange(4), weights=np.ones(4))
    assert all(torch.equal(proxy.state_dict()[k], weights[k]) for k in weights)  # never trained
    for each in (scorer, bad_loss, nan_loss, pool_scorer):
        assert each.stats()["steps"] == 0 and each.stats()["pools"] == 0


def test_a_plain_loop_scores_with_the_proxy_and_trains_the_main_model_on_top_k():
    """The proxy replaces the main model's scoring forward: DataLoader workers fetch the candidates, the proxy
    scores them, the selector takes the top 8, the main model trains on them, and the proxy learns from the same
    rows with the main model's losses at hand for the rank correlation."""
    x, y = problem(n=256)
    model = mlp(hidden=64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    sampler = PrioritizedSampler(256, batch_size=32, alpha=0.0, seed=0)
    batches = CandidateBatchSampler(sampler, Selector(TopK(8), seed=0))
    loader = DataLoader(TensorDataset(x, y), batch_sampler=batches, num_workers=2)
    proxy = make_proxy()
    start = float(eval_scores(model, (x, y)).mean())
    for _ in range(3):
        for xb, yb in loader:
            chosen = batches.choose(batches.next_batch_info(), proxy.score((xb, yb)))
            xs, ys = take_rows((xb, yb), chosen.positions)
            losses = cross_entropy_rows(model, (xs, ys))
            loss = (losses * torch.as_tensor(chosen.weights, dtype=losses.dtype)).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            proxy.feedback((xb, yb), positions=chosen.positions, main_losses=losses.detach(), weights=chosen.weights)
    stats = proxy.stats()
    assert stats["steps"] == 24 and stats["train_rows"] == 24 * 8 and stats["score_rows"] == 24 * 32
    assert batches.select.selector.stats()["selected"] == 24 * 8
    assert stats["correlated_steps"] == 24 and -1.0 <= stats["rank_correlation"] <= 1.0
    assert float(eval_scores(model, (x, y)).mean()) < start
