"""Small models, data and score functions the scoring tests share. The score functions live at module level, so
a spawned scorer process can import them."""
from __future__ import annotations

import torch
from torch.nn import functional as F


def cross_entropy_rows(model: torch.nn.Module, batch) -> torch.Tensor:
    """Per-example cross-entropy of ``model`` on an (x, y) batch."""
    x, y = batch
    return F.cross_entropy(model(x), y, reduction="none")


def failing_on_negative_first(model: torch.nn.Module, batch) -> torch.Tensor:
    """Like `cross_entropy_rows`, but raises when the first feature of the first row is negative."""
    x, _ = batch
    if float(x[0, 0]) < 0:
        raise RuntimeError("a deliberate failure of score_fn")
    return cross_entropy_rows(model, batch)


def problem(n: int = 512, features: int = 8, classes: int = 3, seed: int = 0):
    """``n`` examples of one fixed linear classification task (the same task for every ``n`` and ``seed``; the
    seed draws the examples): (x, y)."""
    w = torch.randn(features, classes, generator=torch.Generator().manual_seed(1234))
    x = torch.randn(n, features, generator=torch.Generator().manual_seed(seed))
    y = (x @ w).argmax(1)
    return x, y


def mlp(features: int = 8, classes: int = 3, hidden: int = 16, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, classes))


def sleepy_rows(model: torch.nn.Module, batch) -> torch.Tensor:
    """`cross_entropy_rows` after a sleep of 0-4 ms that depends on the batch: the scorer's timing varies, its
    results must not."""
    import time

    x, _ = batch
    time.sleep(0.001 * (int(abs(float(x[0, 0])) * 1000) % 5))
    return cross_entropy_rows(model, batch)


def pools(count: int, size: int = 32, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` candidate pools of ``size`` rows of `problem`."""
    x, y = problem(n=count * size, seed=seed)
    return [(x[i * size:(i + 1) * size], y[i * size:(i + 1) * size]) for i in range(count)]


def train_on_top(model, optimizer, pool, losses, k: int = 8) -> None:
    """One SGD step of ``model`` on the ``k`` rows of ``pool`` with the highest ``losses``."""
    x, y = pool
    top = torch.argsort(torch.as_tensor(losses), descending=True, stable=True)[:k]
    loss = cross_entropy_rows(model, (x[top], y[top])).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def eval_scores(model, pool) -> torch.Tensor:
    """Synchronous scoring: ``model`` in eval mode, no gradients (what a BackgroundScorer's copy does)."""
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            return cross_entropy_rows(model, pool)
    finally:
        model.train(was)


def running_threads() -> set:
    """The threads alive now (a thread object of an earlier test may still be listed while it ends)."""
    import threading

    return {t for t in threading.enumerate() if t.is_alive()}


def new_threads_after(before: set, timeout: float = 5.0) -> set:
    """Threads alive that were not in ``before``, once those that are ending have ended (a multiprocessing queue's
    feeder thread, e.g., ends a moment after its queue is closed): empty means nothing was left running."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        left = running_threads() - before
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)
