"""CUDA checks of the scoring parts: a BackgroundScorer on a side stream (and on the trainer's stream) scores with
exactly the weights its schedule says, while the trainer's kernels are still in flight; candidates made on the
GPU just before `submit` are read complete; nothing outlives close(). Skipped where CUDA is missing."""
from __future__ import annotations

import copy
import threading

import pytest
import torch
from torch.nn import functional as F

from replayloader.torch.scoring import BackgroundScorer, ProxyScorer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def score(model, pool):
    x, y = pool
    return F.cross_entropy(model(x), y, reduction="none")


def wide_mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)).cuda()


def gpu_pool(t, rows=1024):
    generator = torch.Generator(device="cuda").manual_seed(t)
    x = torch.randn(rows, 512, device="cuda", generator=generator)
    return x, (x[:, :10].argmax(1))  # made on the trainer's stream right before submit


@pytest.mark.parametrize("mode, refresh_every", [("stream", 1), ("stream", 3), ("thread", 2)])
def test_cuda_scores_follow_the_schedule_exactly_while_the_trainer_runs_ahead(mode, refresh_every):
    model = wide_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    snapshots, got, pools = [copy.deepcopy(model)], [], {}
    steps = 12
    with BackgroundScorer(model, score, refresh_every=refresh_every, mode=mode) as scorer:
        pools[0] = gpu_pool(0)
        scorer.submit(pools[0])
        for t in range(steps):
            pools[t + 1] = gpu_pool(t + 1)
            scorer.submit(pools[t + 1])
            losses = scorer.result()
            assert losses.device.type == "cuda"
            got.append(losses)
            x, y = pools[t]
            top = torch.argsort(losses, descending=True)[:128]
            for _ in range(3):  # several in-place updates queued behind the snapshot
                loss = F.cross_entropy(model(x[top]), y[top])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            scorer.step(model)
            snapshots.append(copy.deepcopy(model))
        stats = scorer.stats()
    for t, losses in enumerate(got):
        submitted = max(0, t - 1)
        reference = snapshots[submitted - submitted % refresh_every].eval()
        with torch.no_grad():
            want = score(reference, pools[t])
        torch.testing.assert_close(losses, want, rtol=1e-5, atol=1e-5)
    assert stats["pools"] == steps and stats["refreshes"] == steps // refresh_every
    assert not [t for t in threading.enumerate() if t.name == "replayloader-scorer"]


def test_a_proxy_scores_and_learns_on_the_gpu():
    torch.manual_seed(0)
    proxy = torch.nn.Linear(512, 10).cuda()
    scorer = ProxyScorer(proxy, torch.optim.SGD(proxy.parameters(), lr=0.1), score, sync_timing=True)
    for t in range(5):
        pool = gpu_pool(t, rows=256)
        scores = scorer.score(pool)
        assert scores.device.type == "cuda" and scores.shape == (256,)
        rows = torch.argsort(scores, descending=True)[:32]
        scorer.feedback(pool, positions=rows, main_losses=scores[rows] * 2)
    stats = scorer.stats()
    assert stats["steps"] == 5 and stats["rank_correlation"] == pytest.approx(1.0) and stats["train_s"] > 0
