"""Cheaper scoring for score-then-select: score the next pool in the background, or score with a small proxy.

A selection step costs one no-grad forward over the n_B candidates besides the training step over the n_b chosen
rows (docs/selection.md, cost model). Two parts cut what the trainer pays for that forward (issue 28, levers d
and e); each works with any candidate source (`CandidateBatchSampler`, `ScoreThenSelect`, a replay buffer):

- `BackgroundScorer`: a copy of the model, refreshed from the trainer's model every ``refresh_every`` steps,
  scores pool t+1 on a background thread (or a side CUDA stream, or another device, or a worker process) while
  the trainer trains on pool t. Why: the scoring forward then costs the trainer nothing whenever a core or a
  stream is free for it; the price is that the scores come from weights up to ``refresh_every`` steps old, which
  `stats()` reports. The scores depend only on the order of the calls (``submit``, ``step``), never on timing,
  so a run is exactly reproducible.
- `ProxyScorer`: a much smaller model, trained online beside the main one on the rows the main model trains on
  (as in ClassAct and JEST), scores the candidates in its place. Why: a forward of the proxy can cost a small
  fraction of the main model's; the price is its own training step and a ranking that only approximates the
  main model's, so `stats()` reports the proxy's seconds and rows and the rank correlation between its losses
  and the main model's on the rows trained.

Optional module: torch is imported here only.
"""
from __future__ import annotations

import copy
import itertools
import math
import pickle
import queue
import threading
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from .. import _checks as checks
from .._moved import keyword_only
from .._arrays import to_numpy
from ..loader.workers import WorkerError
from ..selection.rules import ReducibleLoss
from ..state.checks import InvalidState, check_header, field, integer as state_integer, number as state_number, \
    require
from .candidates import take_rows

__all__ = ["BackgroundScorer", "ProxyScorer", "rank_correlation"]

STATE_VERSION = 1
ScoreFn = Callable[[torch.nn.Module, Any], torch.Tensor]
Mode = Literal["thread", "process", "stream"]
MODES = ("thread", "process", "stream")


# ---------------------------------------------------------------------------------------------------- helpers
def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter (or buffer); a model without either runs where tensors are made
    by default."""
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        return tensor.device
    return torch.empty(0).device


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The module under a DistributedDataParallel / DataParallel wrapper or a ``torch.compile`` result, whose
    state dict has the plain keys (a wrapper prefixes them with ``module.`` or ``_orig_mod.``)."""
    while True:
        if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):  # torch.compile's OptimizedModule
            model = model._orig_mod
        else:
            return model


def first_tensor(batch: Any) -> torch.Tensor | np.ndarray | None:
    """The first tensor (or numpy array) of a nested batch, or None."""
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        return batch
    values = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (tuple, list)) else ()
    for value in values:
        found = first_tensor(value)
        if found is not None:
            return found
    return None


def batch_rows(batch: Any, name: str) -> int | None:
    """How many rows (examples) a nested batch holds: the length of its first tensor or array (None when it holds
    none, e.g. raw strings that the score function tokenizes)."""
    found = first_tensor(batch)
    if found is None:
        return None
    if found.ndim == 0 or len(found) == 0:
        raise ValueError(f"{name} must hold at least one row (its first tensor has shape {tuple(found.shape)})")
    return len(found)


def to_device(batch: Any, device: torch.device) -> Any:
    """A nested batch with every tensor on ``device`` (nothing moves if it is there already)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def per_example(out: Any, rows: int | None, where: str) -> torch.Tensor:
    """``out`` as a 1-D float tensor of one loss per row, or a ValueError saying what came back."""
    if isinstance(out, np.ndarray):
        out = torch.from_numpy(out)
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"{where} must return a tensor of per-example losses, got {type(out).__name__}")
    want = "(n,)" if rows is None else f"({rows},)"
    if out.ndim != 1 or (rows is not None and len(out) != rows) or not out.is_floating_point():
        raise ValueError(f"{where} must return one floating-point loss per candidate, shape {want}, got dtype "
                         f"{out.dtype} shape {tuple(out.shape)}")
    return out


def ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties sharing their average rank."""
    order = np.argsort(values, kind="stable")
    ranked = np.empty(len(values))
    ranked[order] = np.arange(1, len(values) + 1)
    unique, inverse = np.unique(values, return_inverse=True)
    if len(unique) < len(values):
        ranked = (np.bincount(inverse, ranked) / np.bincount(inverse))[inverse]
    return ranked


def rank_correlation(a: Any, b: Any) -> float:
    """Spearman's rank correlation of two equally long score vectors (NaN when either is constant or shorter
    than 2): how well one ranking tracks the other, whatever the scales."""
    x = np.asarray(to_numpy(a, "a"), np.float64).ravel()
    y = np.asarray(to_numpy(b, "b"), np.float64).ravel()
    if x.shape != y.shape:
        raise ValueError(f"a and b must have the same length, got {len(x)} and {len(y)}")
    if len(x) < 2:
        return math.nan
    rx, ry = ranks(x) - (len(x) + 1) / 2, ranks(y) - (len(y) + 1) / 2
    scale = math.sqrt(float(rx @ rx) * float(ry @ ry))
    return float(rx @ ry) / scale if scale > 0 else math.nan


def layout(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """The model's state-dict keys and shapes: what a refresh or a checkpoint must match."""
    return {key: tuple(value.shape) for key, value in model.state_dict().items()}


def check_layout(state: Mapping, expected: Mapping[str, tuple[int, ...]], name: str, error=ValueError) -> None:
    """Raise ``error`` naming ``name`` unless ``state`` has exactly the keys and shapes of ``expected``."""
    missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or extra:
        raise error(f"{name} does not match the scorer's model: missing keys {missing[:5]}, unexpected keys "
                    f"{extra[:5]}")
    for key, shape in expected.items():
        value = state[key]
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
            got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise error(f"{name}[{key!r}] must be a tensor of shape {shape}, got {got}")


def adopted(value: Any) -> Any:
    """Hand the worker's CUDA tensors (a tensor or a dict of them) to the caller's stream: the caching allocator
    must not give their memory back to the worker's stream while the caller's kernels may still read it."""
    tensors = value.values() if isinstance(value, Mapping) else [value]
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and tensor.is_cuda:
            tensor.record_stream(torch.cuda.current_stream(tensor.device))
    return value


def cuda_event(device: torch.device) -> torch.cuda.Event | None:
    """An event recorded now on ``device``'s current stream (None off CUDA): the worker waits on it before it
    reads what the trainer's stream wrote."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


# ---------------------------------------------------------------------------------------------------- the worker
_STOP = "stop"


def _serve(jobs: Any, results: Any, model: torch.nn.Module, score_fn: ScoreFn, device: torch.device,
           side_stream: bool, threads: int | None, parent: Any = None) -> None:
    """The scorer's loop, the same on a thread and in a process: take jobs in order, put one result per job.

    Jobs are (kind, ticket, payload, rows, event): ``refresh`` loads a state dict into the copy, ``score`` runs
    ``score_fn(copy, payload)`` without gradients, ``weights`` hands back a clone of the copy's state dict. A
    result is (ticket, ok, value or traceback text, seconds); the first is ("ready", ok, error, 0.0), once the
    worker is set up. One worker, one queue: the weights each pool is
    scored with are fixed by the order of the calls, never by timing. In a worker process (``parent`` given)
    payloads and values travel pickled by value (bytes through the queue's pipe), never through shared memory.
    """
    try:
        if threads is not None:
            torch.get_num_threads()  # this thread's lazy init first, or the first op here would undo the next line
            torch.set_num_threads(threads)
        if device.type == "cuda":
            torch.cuda.set_device(device)  # a new thread has no current CUDA context (cuBLAS would warn, guess)
        stream = torch.cuda.Stream(device) if side_stream else None
    except BaseException:  # noqa: BLE001 - the trainer's thread raises it
        results.put(("ready", False, traceback.format_exc(), 0.0))
        return
    results.put(("ready", True, None, 0.0))
    with torch.no_grad(), (torch.cuda.stream(stream) if stream is not None else nullcontext()):
        while True:
            if parent is None:
                job = jobs.get()
            else:  # a worker process: leave when the parent is gone, never outlive it
                try:
                    job = jobs.get(timeout=1.0)
                except queue.Empty:
                    if not parent.is_alive():
                        return
                    continue
            if job == _STOP:
                return
            kind, ticket, payload, rows, event = job
            start = time.perf_counter()
            try:
                if parent is not None and payload is not None:
                    payload = pickle.loads(payload)
                if event is not None:
                    event.synchronize()  # what the trainer's stream wrote is ready (blocks this worker only)
                if kind == "refresh":
                    model.load_state_dict(payload)
                    value = None
                elif kind == "score":
                    value = per_example(score_fn(model, to_device(payload, device)), rows, "score_fn").detach()
                else:  # "weights"
                    value = {key: tensor.detach().clone() for key, tensor in model.state_dict().items()}
                if device.type == "cuda":
                    torch.cuda.current_stream(device).synchronize()  # done before the trainer may touch it
                payload = None  # drop the pool here, after its kernels finished
                if parent is not None:
                    value = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
                results.put((ticket, True, value, time.perf_counter() - start))
            except BaseException:  # noqa: BLE001 - every failure goes back to the trainer's thread
                payload = None
                results.put((ticket, False, traceback.format_exc(), time.perf_counter() - start))


def _serve_process(jobs: Any, results: Any, packed: bytes, threads: int | None) -> None:
    """A worker process's entry point (spawned: CPU only); ``packed`` is the pickled (model copy, score_fn)."""
    import multiprocessing

    model, score_fn = pickle.loads(packed)
    _serve(jobs, results, model, score_fn, model_device(model), False, threads, multiprocessing.parent_process())


class _Handles:
    """What the worker's shutdown needs, held apart from the scorer so that garbage collection can run it."""

    def __init__(self, jobs: Any, results: Any, worker: Any, process: bool) -> None:
        self.jobs, self.results, self.worker, self.process = jobs, results, worker, process



def _meters(state: Mapping, where: str, counter_keys: Sequence[str],
            second_keys: Sequence[str]) -> tuple[dict[str, int], dict[str, float]]:
    """A scorer state's ``counters`` (integers >= 0) and ``seconds`` (numbers >= 0), each with exactly its keys:
    the one check both scorers' loads share."""
    out = []
    for key, names, read in (("counters", counter_keys, state_integer), ("seconds", second_keys, state_number)):
        part = field(state, key, where)
        require(isinstance(part, Mapping) and set(part) == set(names), f"{where}['{key}'] must have the keys "
                f"{sorted(names)}")
        out.append({name: read(part, name, f"{where}['{key}']", 0) for name in names})
    return out[0], out[1]

def _shutdown(handles: _Handles, timeout: float = 30.0) -> None:
    """Stop the worker and wait for it (a thread finishes the job in hand; a process is terminated after
    ``timeout`` seconds), then release the queues and their feeder threads."""
    worker = handles.worker
    if worker is None:
        return
    handles.worker = None
    try:
        if worker.is_alive():
            handles.jobs.put(_STOP)
        if worker is threading.current_thread():  # collected on the worker itself: it stops after this job
            return
        if handles.process:
            worker.join(timeout)
            if worker.is_alive():
                worker.terminate()
                worker.join(5.0)
            clean = worker.exitcode == 0
            for q in (handles.jobs, handles.results):
                if not clean:
                    q.cancel_join_thread()  # a dead reader: do not wait to flush what nobody will read
                q.close()
                q.join_thread()
        else:
            worker.join()
    finally:
        handles.jobs = handles.results = None


@dataclass
class _Pool:
    """A submitted pool: its ticket, rows, the trainer's step when it was submitted, the step of the weights that
    score it, and its result once received (ok, losses or traceback text, seconds)."""

    ticket: int | None
    rows: int | None
    submitted_at: int
    weights_at: int
    result: tuple | None = None


_COUNTERS = ("pools", "scored_rows", "refreshes", "behind", "staleness_sum", "staleness_max", "score_age_sum",
             "score_age_max")
_SECONDS = ("wait_s", "score_s", "load_s", "snapshot_s")


class BackgroundScorer:
    """Scores the next candidate pool with a copy of the model while the trainer trains on the current one.

    Experimental: no measurement in this repository yet shows it paying for itself; it may change or go until
    one does (docs/selection.md, "Experimental levers").

    The plain loop (``batches`` a `CandidateBatchSampler`, ``pools`` its DataLoader's iterator)::

        xb, yb = next(pools); info = batches.next_batch_info(); scorer.submit((xb, yb))
        for step in range(steps):
            xn, yn = next(pools); info_next = batches.next_batch_info()
            scorer.submit((xn, yn))                     # pool t+1 is scored while ...
            chosen = batches.choose(info, scorer.result())   # ... pool t is chosen from its scores
            ... train on take_rows((xb, yb), chosen.positions) ...
            scorer.step(model)                          # after the optimizer step
            (xb, yb), info = (xn, yn), info_next

    Which weights score a pool: the copy starts as the model; `step` counts training steps and every
    ``refresh_every``-th call snapshots the model's state dict (one clone on the trainer's thread) for the copy
    to load before the next pool. A pool submitted after s steps is therefore scored with the weights of step
    r·⌊s/r⌋, whatever the timing: with ``refresh_every=1`` the scores of pool t+1 are exactly those of
    synchronous scoring with the model of the step before the one that trains on it.

    Args:
        model: the trainer's model (deep-copied; the copy never gets gradients and runs in eval mode when
            ``score_in_eval_mode``: no dropout in the scores, no batch-norm statistics moved). A DDP or
            DataParallel wrapper or a ``torch.compile`` result is unwrapped: the copy is the plain module.
        score_fn: ``score_fn(model_copy, candidates) -> (n,)`` per-example losses, run under ``torch.no_grad``
            on the worker (candidates as submitted, their tensors moved to the copy's device).
        refresh_every: r, training steps between two refreshes of the copy (its staleness is below r steps when
            a pool is scored).
        device: where the copy lives and scores (default: the model's device). Another GPU than the trainer's
            gives the scorer a device of its own.
        mode: ``"thread"`` (a Python thread; torch ops release the GIL, so on CPU it uses a core the trainer
            leaves free), ``"stream"`` (a thread whose CUDA work runs on a side `torch.cuda.Stream`, so the GPU
            overlaps the two forwards; CUDA only) or ``"process"`` (a spawned worker process, CPU only: no GIL
            shared with the trainer, at the price of a process start of seconds, a picklable ``score_fn``, and
            candidates, refreshed weights and losses pickled by value through a pipe).
        threads: the scorer's torch intra-op threads (default 1; None: leave torch's default). On CPU keep the
            trainer's threads (`torch.set_num_threads`) plus these at most the number of cores.
        score_in_eval_mode: score with the copy in eval mode (default True).
        start_timeout_s: how long to wait for a worker process to start.

    Call it from one thread, the trainer's (it is not locked). Returned losses may be used on the trainer's
    stream at once: the worker finished them, and they are handed over to that stream.
    """

    def __init__(self, model: torch.nn.Module, score_fn: ScoreFn, *, refresh_every: int = 1,
                 device: torch.device | str | None = None, mode: Mode = "thread", threads: int | None = 1,
                 score_in_eval_mode: bool = True, start_timeout_s: float = 120.0) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not callable(score_fn):
            raise TypeError(f"score_fn must be callable as score_fn(model, candidates), got {type(score_fn).__name__}")
        self.refresh_every = checks.integer("refresh_every", refresh_every, 1)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        threads = checks.optional_integer("threads", threads, 1)
        start_timeout_s = checks.number("start_timeout_s", start_timeout_s, 0.0, low_open=True)
        try:
            device = model_device(model) if device is None else torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"device must name a torch device, got {device!r}") from exc
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if mode == "stream" and device.type != "cuda":
            raise ValueError(f"mode='stream' runs on a side CUDA stream and needs a CUDA device, got device {device}; "
                             f"use mode='thread' (or 'process') elsewhere")
        if mode == "process" and device.type != "cpu":
            raise ValueError(f"mode='process' scores on the CPU only, got device {device}; on a GPU use "
                             f"mode='stream' or another device with mode='thread'")
        self.mode, self.device, self.threads = mode, device, threads
        scorer = copy.deepcopy(unwrapped(model)).to(device)
        for parameter in scorer.parameters():
            parameter.requires_grad_(False)
            parameter.grad = None
        scorer.train(not score_in_eval_mode)
        self.layout = layout(scorer)
        self.steps = 0  # training steps told by `step`
        self.refreshed_at = 0  # the step whose weights the next submitted pool is scored with
        self.counters = dict.fromkeys(_COUNTERS, 0)
        self.seconds = dict.fromkeys(_SECONDS, 0.0)
        self.last: dict[str, float] = {}
        self._pending: deque[_Pool] = deque()
        self._received: dict[int, tuple] = {}
        self._tickets = itertools.count()
        self._unanswered: set[int] = set()  # jobs sent and not answered yet
        self._refreshes: set[int] = set()  # those of them that are refreshes
        self._broken: str | None = None
        self._handles = self._start(scorer, score_fn, start_timeout_s)
        self._finalizer = weakref.finalize(self, _shutdown, self._handles)

    # -------------------------------------------------------------------------------------------- the worker
    def _start(self, scorer: torch.nn.Module, score_fn: ScoreFn, timeout: float) -> _Handles:
        if self.mode == "process":
            import torch.multiprocessing as mp

            try:  # by value: shared memory would start multiprocessing's fd-sharing thread in this process
                packed = pickle.dumps((scorer, score_fn), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:
                raise ValueError(f"mode='process' sends score_fn and the model to a worker process, so both must "
                                 f"pickle (score_fn a module-level function): {exc}") from exc
            context = mp.get_context("spawn")
            jobs, results = context.Queue(), context.Queue()
            worker = context.Process(target=_serve_process, args=(jobs, results, packed, self.threads),
                                     daemon=True, name="replayloader-scorer")
            handles = _Handles(jobs, results, worker, True)
            worker.start()
            return self._ready(handles, timeout)  # the worker imports torch first: seconds
        jobs, results = queue.SimpleQueue(), queue.SimpleQueue()
        worker = threading.Thread(target=_serve, name="replayloader-scorer", daemon=True,
                                  args=(jobs, results, scorer, score_fn, self.device, self.mode == "stream",
                                        self.threads))
        mine = torch.get_num_threads()
        worker.start()
        try:
            return self._ready(_Handles(jobs, results, worker, False), timeout)
        finally:
            if self.threads is not None:
                # torch.set_num_threads on the worker also set the default of threads started later; give that
                # back (this thread's own count is unchanged; the worker keeps its own)
                torch.set_num_threads(mine)

    @staticmethod
    def _ready(handles: _Handles, timeout: float) -> _Handles:
        """Wait for the worker's first message; if it failed to set up (or died, or took longer than
        ``timeout``), stop it and raise WorkerError."""
        deadline, worker = time.perf_counter() + timeout, handles.worker
        while True:
            try:
                _, ok, error, _ = handles.results.get(timeout=0.2)
                break
            except queue.Empty:
                if not worker.is_alive() or time.perf_counter() > deadline:
                    message = (f"the scorer's worker did not start within {timeout} s" if worker.is_alive() else
                               f"the scorer's worker exited while starting (exit code "
                               f"{getattr(worker, 'exitcode', None)})")
                    _shutdown(handles, 1.0)
                    raise WorkerError(message) from None
        if not ok:
            _shutdown(handles, 1.0)
            raise WorkerError(f"the scorer's worker failed to start:\n{error}")
        return handles

    def _put(self, kind: str, payload: Any, rows: int | None = None, event: Any = None) -> int:
        if self.mode == "process" and payload is not None:
            payload = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)  # by value, see `_serve`
        ticket = next(self._tickets)
        self._handles.jobs.put((kind, ticket, payload, rows, event))
        self._unanswered.add(ticket)
        if kind == "refresh":
            self._refreshes.add(ticket)
        return ticket

    def _absorb(self, item: tuple) -> None:
        """File one answer of the worker: a refresh is accounted at once (its failure breaks the scorer), a pool's
        or a weights request's losses wait in ``_received`` for whoever asks."""
        ticket, ok, value, seconds = item
        self._unanswered.discard(ticket)
        if ok and self.mode == "process":
            value = pickle.loads(value)
        if ticket not in self._refreshes:
            self._received[ticket] = (ok, value, seconds)
            return
        self._refreshes.discard(ticket)
        self.seconds["load_s"] += seconds
        if not ok:
            self._broken = f"loading the model's weights into the scorer's copy failed:\n{value}"
            raise WorkerError(self._broken)

    def _poll(self) -> None:
        """File every answer that has arrived, without waiting."""
        while True:
            try:
                item = self._handles.results.get_nowait()
            except queue.Empty:
                return
            self._absorb(item)

    def _wait(self, ticket: int, timeout: float | None = None) -> None:
        """Wait until the worker has answered job ``ticket`` (filing every answer before it)."""
        deadline = None if timeout is None else time.perf_counter() + timeout
        while ticket in self._unanswered:
            left = 0.5 if deadline is None else min(0.5, deadline - time.perf_counter())
            if left <= 0:
                raise TimeoutError(f"the scorer has not finished the pool within {timeout} s (it is still pending)")
            try:
                self._absorb(self._handles.results.get(timeout=left))
            except queue.Empty:
                if not self._handles.worker.is_alive():
                    code = getattr(self._handles.worker, "exitcode", None)
                    self._broken = f"the scorer's worker died (exit code {code})"
                    raise WorkerError(self._broken) from None

    def _check_usable(self) -> None:
        if self._handles.worker is None:
            raise RuntimeError("this BackgroundScorer is closed")
        if self._broken is not None:
            raise WorkerError(f"this BackgroundScorer is broken and must be closed: {self._broken}")

    # -------------------------------------------------------------------------------------------- the trainer's calls
    def submit(self, candidates: Any) -> None:
        """Start scoring a pool (any nested batch of tensors or arrays that ``score_fn`` takes); its losses come
        back from `result`, pools in the order submitted. Returns at once (the worker scores in the background).
        The candidates must not be changed in place until their result is taken."""
        self._check_usable()
        rows = batch_rows(candidates, "candidates")
        found = first_tensor(candidates)
        event = cuda_event(found.device) if isinstance(found, torch.Tensor) else None
        ticket = self._put("score", candidates, rows, event)
        self._pending.append(_Pool(ticket, rows, self.steps, self.refreshed_at))

    def result(self, *, timeout: float | None = None) -> torch.Tensor:
        """The per-example losses (a 1-D tensor on the scorer's device) of the oldest pool submitted and not yet
        taken. Waits only if the scorer has fallen behind (the wait is counted in `stats`); a ``timeout`` that
        passes raises TimeoutError and leaves the pool pending. A failing ``score_fn`` raises WorkerError with
        its traceback (that pool is consumed; the scorer goes on)."""
        self._check_usable()
        if timeout is not None:
            timeout = checks.number("timeout", timeout, 0.0)
        if not self._pending:
            raise RuntimeError("result() needs a pool to score: call submit(candidates) first")
        pool = self._pending[0]
        if pool.result is None:
            self._poll()
            ready = pool.ticket not in self._unanswered
            start = time.perf_counter()
            self._wait(pool.ticket, timeout)
            self.seconds["wait_s"] += time.perf_counter() - start
            self.counters["behind"] += 0 if ready else 1
            pool.result = self._received.pop(pool.ticket)
        self._pending.popleft()
        ok, value, seconds = pool.result
        staleness, age = pool.submitted_at - pool.weights_at, self.steps - pool.weights_at
        c = self.counters
        c["pools"] += 1
        c["scored_rows"] += pool.rows if pool.rows is not None else (len(value) if ok else 0)
        c["staleness_sum"] += staleness
        c["staleness_max"] = max(c["staleness_max"], staleness)
        c["score_age_sum"] += age
        c["score_age_max"] = max(c["score_age_max"], age)
        self.seconds["score_s"] += seconds
        self.last = {"staleness": staleness, "score_age": age, "score_s": seconds}
        if not ok:
            raise WorkerError(f"score_fn failed on a pool (submitted after step {pool.submitted_at}):\n{value}")
        return adopted(value)

    def step(self, model: torch.nn.Module) -> None:
        """Count one training step of ``model`` (call it after the optimizer step). Every ``refresh_every``-th
        call snapshots the model's state dict for the copy: pools submitted from then on are scored with it.
        A model whose state dict does not match the copy's raises ValueError and counts nothing."""
        self._check_usable()
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be the trainer's torch.nn.Module, got {type(model).__name__}")
        steps = self.steps + 1
        if steps % self.refresh_every == 0:
            start = time.perf_counter()
            model = unwrapped(model)
            state = model.state_dict()
            check_layout(state, self.layout, "model")
            snapshot = {key: value.detach() if self.mode == "process" else value.detach().clone()  # pickled: a copy
                        for key, value in state.items()}
            event = cuda_event(model_device(model))
            self._put("refresh", snapshot, None, event)
            self.seconds["snapshot_s"] += time.perf_counter() - start
            self.counters["refreshes"] += 1
            self.refreshed_at = steps
        self.steps = steps
        self._poll()

    def stats(self) -> dict[str, float]:
        """Schedule, staleness and cost.

        ``steps``, ``refreshes``, ``pools`` (results taken), ``pending``, ``scored_rows``; ``staleness_*``: how
        many steps the copy's weights were behind the trainer's model when a pool was submitted (below
        ``refresh_every``); ``score_age_*``: how many steps behind they were when `result` handed the scores over, that
        is when they are used (in the plain loop one more than the staleness: pool t+1 is submitted a step
        before it is trained on); ``behind``: results the trainer had to
        wait for; ``wait_s``: the trainer's seconds spent waiting in `result`; ``snapshot_s``: the trainer's
        seconds cloning the state dict for refreshes; ``score_s`` and ``load_s``: the worker's seconds scoring
        and loading weights (on a side stream: including the wait for the GPU)."""
        c, pools = self.counters, self.counters["pools"]
        return {"steps": self.steps, "refresh_every": self.refresh_every, "refreshes": c["refreshes"],
                "pools": pools, "pending": len(self._pending), "scored_rows": c["scored_rows"],
                "staleness_last": self.last.get("staleness", 0),
                "staleness_mean": c["staleness_sum"] / pools if pools else 0.0, "staleness_max": c["staleness_max"],
                "score_age_last": self.last.get("score_age", 0),
                "score_age_mean": c["score_age_sum"] / pools if pools else 0.0, "score_age_max": c["score_age_max"],
                "behind": c["behind"], **self.seconds}

    # -------------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        """The schedule (steps, the step of the copy's weights), the copy's weights (so a resumed run with
        ``refresh_every > 1`` scores with the same stale weights), the counters, and the losses of pools submitted
        and not taken yet (waited for here), which a loaded scorer hands out first. The candidates themselves are
        the loop's to save."""
        self._check_usable()
        ticket = self._put("weights", None)  # answered after every job before it: all pending pools scored
        self._wait(ticket)
        ok, weights, _ = self._received.pop(ticket)
        if not ok:
            raise WorkerError(f"reading the scorer's weights failed:\n{weights}")
        adopted(weights)
        pending = []
        for pool in self._pending:
            ok, value, seconds = pool.result if pool.result is not None else self._received[pool.ticket]
            if not ok:
                raise WorkerError(f"a pending pool failed to score, so it cannot be saved:\n{value}")
            pending.append({"losses": adopted(value).detach().clone(), "rows": -1 if pool.rows is None else pool.rows,
                            "submitted_at": pool.submitted_at, "weights_at": pool.weights_at, "score_s": seconds})
        return {"version": STATE_VERSION, "config": {"refresh_every": self.refresh_every}, "steps": self.steps,
                "refreshed_at": self.refreshed_at, "weights": weights, "pending": pending,
                "counters": dict(self.counters), "seconds": dict(self.seconds)}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore a `state_dict` (same ``refresh_every``, same model layout). Only with no pool pending. Every
        entry is checked first: a bad state raises `InvalidState` and changes nothing."""
        self._check_usable()
        if self._pending:
            raise RuntimeError(f"load_state_dict needs no pool pending, but {len(self._pending)} are: take their "
                               f"results first")
        where = check_header(state, STATE_VERSION, {"refresh_every": self.refresh_every}, "BackgroundScorer")
        steps = state_integer(state, "steps", where, 0)
        refreshed_at = state_integer(state, "refreshed_at", where, 0, steps)
        require(refreshed_at == steps - steps % self.refresh_every,
                f"{where}['refreshed_at'] = {refreshed_at} does not follow the schedule (every {self.refresh_every} "
                f"steps, {steps} steps taken: {steps - steps % self.refresh_every})")
        weights = field(state, "weights", where)
        require(isinstance(weights, Mapping), f"{where}['weights'] must be a mapping, got {type(weights).__name__}")
        check_layout(weights, self.layout, f"{where}['weights']", InvalidState)
        pending_state = field(state, "pending", where)
        require(isinstance(pending_state, (list, tuple)), f"{where}['pending'] must be a list")
        pending = []
        for number, entry in enumerate(pending_state):
            name = f"{where}['pending'][{number}]"
            losses = field(entry, "losses", name)
            require(isinstance(losses, torch.Tensor) and losses.ndim == 1 and losses.is_floating_point(),
                    f"{name}['losses'] must be a 1-D floating-point tensor")
            rows = state_integer(entry, "rows", name, -1)
            require(rows in (-1, len(losses)), f"{name}['rows'] = {rows} but it holds {len(losses)} losses")
            submitted = state_integer(entry, "submitted_at", name, 0, steps)
            weights_at = state_integer(entry, "weights_at", name, 0, submitted)
            seconds = state_number(entry, "score_s", name, 0.0)
            pending.append(_Pool(None, None if rows == -1 else rows, submitted, weights_at,
                                 (True, losses.detach().clone().to(self.device), float(seconds))))
        counters, seconds = _meters(state, where, _COUNTERS, _SECONDS)
        self._wait(self._put("refresh", {key: value.detach().clone() for key, value in weights.items()}))
        self.steps, self.refreshed_at, self.counters, self.seconds = steps, refreshed_at, counters, seconds
        self._pending = deque(pending)
        self.last = {}

    # -------------------------------------------------------------------------------------------- closing
    @property
    def closed(self) -> bool:
        return self._handles.worker is None

    def close(self) -> None:
        """Stop the worker and wait for it (a job in hand is finished first). Pending results are dropped.
        Idempotent; also run on garbage collection and at interpreter exit."""
        self._finalizer()
        self._pending.clear()
        self._received.clear()

    def __enter__(self) -> BackgroundScorer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------------- the proxy
LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]
TRAIN_ON = ("selected", "pool")
_PROXY_COUNTERS = ("pools", "score_rows", "steps", "train_rows", "correlated_steps")
_PROXY_SECONDS = ("score_s", "train_s")


class ProxyScorer:
    """A small model that learns online beside the main one and scores the candidates in its place (ClassAct,
    JEST): `score` is one no-grad forward of the proxy over the pool; `feedback` trains it one optimizer step
    on the rows the main model trained on (``train_on="selected"``) or on the whole pool (``"pool"``).

    Experimental: no measurement in this repository yet shows it paying for itself; it may change or go until
    one does (docs/selection.md, "Experimental levers").

    The loop (``batches`` a `CandidateBatchSampler`)::

        scores = proxy.score((xb, yb))                       # instead of the main model's scoring forward
        chosen = batches.choose(batches.next_batch_info(), scores)
        xs, ys = take_rows((xb, yb), chosen.positions)
        losses = per_example_loss(model(xs), ys)             # the main model's training forward
        ... (losses * weights).mean().backward(); optimizer.step() ...
        proxy.feedback((xb, yb), positions=chosen.positions, main_losses=losses.detach())

    Args:
        proxy_model: the proxy (any `torch.nn.Module`; it stays on its device, and candidates are moved there).
        optimizer: the proxy's optimizer, over ``proxy_model``'s parameters.
        loss_fn: ``loss_fn(proxy_model, rows) -> (n,)`` per-example losses (with gradients when training).
        train_on: ``"selected"`` (the rows the main model trained on, weighted by their importance weights: the
            proxy learns what the main model learns) or ``"pool"`` (every candidate: n_B rows of forward and
            backward on the proxy, a proxy that sees more data).
        irreducible: optional per-example irreducible losses (by dataset index): `score` then returns the
            proxy's reducible loss, loss - irreducible[indices] (use the selector's default `TrainingLoss`
            then, not `ReducibleLoss`, or the irreducible loss is subtracted twice), and the rank correlation
            compares reducible losses.
        score_in_eval_mode: score with the proxy in eval mode (default True).
        window: how many recent steps the mean rank correlation in `stats` covers.
        sync_timing: on CUDA, synchronize the proxy's device around each timed call, so its seconds are GPU
            time rather than launch time (costs the overlap of host and device; default False).
    """

    def __init__(self, proxy_model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn, *,
                 train_on: Literal["selected", "pool"] = "selected", irreducible: Any = None,
                 score_in_eval_mode: bool = True, window: int = 100, sync_timing: bool = False) -> None:
        if not isinstance(proxy_model, torch.nn.Module):
            raise TypeError(f"proxy_model must be a torch.nn.Module, got {type(proxy_model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        owned = {id(p) for p in proxy_model.parameters()}
        optimized = [p for group in optimizer.param_groups for p in group["params"]]
        if not optimized or any(id(p) not in owned for p in optimized):
            raise ValueError("optimizer must optimize proxy_model's parameters (it holds parameters that are not "
                             "the proxy's, or none)")
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable as loss_fn(proxy_model, rows), got {type(loss_fn).__name__}")
        if train_on not in TRAIN_ON:
            raise ValueError(f"train_on must be one of {TRAIN_ON}, got {train_on!r}")
        self.window = checks.integer("window", window, 1)
        self.irreducible = None if irreducible is None else ReducibleLoss(irreducible)  # checks it, read-only copy
        self.model, self.optimizer, self.loss_fn, self.train_on = proxy_model, optimizer, loss_fn, train_on
        self.score_in_eval_mode, self.sync_timing = bool(score_in_eval_mode), bool(sync_timing)
        self.counters = dict.fromkeys(_PROXY_COUNTERS, 0)
        self.seconds = dict.fromkeys(_PROXY_SECONDS, 0.0)
        self.correlations: deque[float] = deque(maxlen=self.window)
        self.last: dict[str, float] = {}

    @property
    def device(self) -> torch.device:
        return model_device(self.model)

    def _clock(self) -> float:
        if self.sync_timing and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _indices(self, indices: Any, count: int) -> np.ndarray | None:
        """Dataset indices as int64 (checked against ``irreducible``), or None when there is no irreducible loss."""
        if self.irreducible is None:
            return None
        if indices is None:
            raise ValueError("indices are needed: with irreducible losses the proxy reads each row's dataset index")
        arr = to_numpy(indices, "indices")
        if arr.ndim != 1 or arr.dtype.kind not in "iu" or len(arr) != count:
            raise ValueError(f"indices must be a 1-D integer array of {count} dataset indices, got dtype {arr.dtype} "
                             f"shape {arr.shape}")
        arr = arr.astype(np.int64)
        self.irreducible.check_indices(arr)
        return arr

    def score(self, candidates: Any, indices: Any = None) -> torch.Tensor:
        """The proxy's per-example losses on a pool (one no-grad forward), a 1-D tensor on the proxy's device;
        with ``irreducible``, minus the irreducible losses of the candidates' dataset ``indices``."""
        rows = batch_rows(candidates, "candidates")
        if rows is not None:
            self._indices(indices, rows)  # checked before the forward, and again below
        start = self._clock()
        was_training = self.model.training
        try:
            with torch.no_grad():
                if self.score_in_eval_mode:
                    self.model.eval()
                losses = per_example(self.loss_fn(self.model, to_device(candidates, self.device)), rows, "loss_fn")
        finally:
            self.model.train(was_training)
        indices = self._indices(indices, len(losses))
        if indices is not None:
            losses = losses - torch.as_tensor(self.irreducible.irreducible[indices], dtype=losses.dtype,
                                              device=losses.device)
        self.seconds["score_s"] += self._clock() - start
        self.counters["pools"] += 1
        self.counters["score_rows"] += len(losses)
        return losses.detach()

    @keyword_only("positions")
    def feedback(self, candidates: Any, *, positions: Any = None, main_losses: Any = None, weights: Any = None,
                 indices: Any = None) -> float:
        """Train the proxy one step and log how well it tracks the main model; returns the proxy's training loss.

        ``candidates``: the pool as scored; ``positions``: the rows of it the main model trained on (the
        selection's ``positions``; needed with ``train_on="selected"`` and for the correlation); ``weights``:
        their importance weights (``train_on="selected"`` only; default 1); ``main_losses``: the main model's
        per-example losses on those rows (from its training forward, at no extra cost): the rank correlation
        with the proxy's losses on the same rows (before its update) goes into `stats`. ``indices``: the rows'
        dataset indices (the selection's ``indices``), needed with ``irreducible`` for the correlation of
        reducible losses. Everything is checked before the proxy changes: bad input raises ValueError and
        changes nothing.
        """
        rows = batch_rows(candidates, "candidates")
        chosen = None
        if positions is not None:
            chosen = to_numpy(positions, "positions")
            if chosen.ndim != 1 or chosen.dtype.kind not in "iu" or len(chosen) == 0:
                raise ValueError(f"positions must be a non-empty 1-D integer array (rows of candidates), got dtype "
                                 f"{chosen.dtype} shape {chosen.shape}")
            chosen = chosen.astype(np.int64)
            out = np.flatnonzero((chosen < 0) | (chosen >= (rows if rows is not None else np.iinfo(np.int64).max)))
            if len(out):
                raise ValueError(f"positions must lie in [0, {rows}) (rows of candidates); positions[{out[0]}] = "
                                 f"{chosen[out[0]]}")
        elif self.train_on == "selected":
            raise ValueError("positions are needed: with train_on='selected' the proxy trains on the rows the main "
                             "model trained on")
        if weights is not None and self.train_on == "pool":
            raise ValueError("weights apply to the selected rows; with train_on='pool' pass none")
        if main_losses is not None:
            if chosen is None:
                raise ValueError("positions are needed with main_losses: they say which rows the losses belong to")
            main = np.asarray(to_numpy(main_losses, "main_losses"), np.float64)
            if main.shape != chosen.shape or not np.isfinite(main).all():
                raise ValueError(f"main_losses must be {len(chosen)} finite losses (one per position), got shape "
                                 f"{main.shape}")
            if self.irreducible is not None:
                main = main - self.irreducible.irreducible[self._indices(indices, len(chosen))]
        train_weights = None
        if weights is not None:
            train_weights = np.asarray(to_numpy(weights, "weights"), np.float64)
            if train_weights.shape != chosen.shape or not np.isfinite(train_weights).all():
                raise ValueError(f"weights must be {len(chosen)} finite importance weights (one per position), got "
                                 f"shape {train_weights.shape}")
        batch = take_rows(candidates, chosen) if self.train_on == "selected" else candidates
        count = len(chosen) if self.train_on == "selected" else rows
        start = self._clock()
        self.model.train()
        per = per_example(self.loss_fn(self.model, to_device(batch, self.device)), count, "loss_fn")
        if not torch.isfinite(per).all():
            raise ValueError("loss_fn returned a non-finite loss for the proxy; it was not trained on them")
        if train_weights is not None:
            loss = (per * torch.as_tensor(train_weights, dtype=per.dtype, device=per.device)).mean()
        else:
            loss = per.mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        value = float(loss.detach())
        self.seconds["train_s"] += self._clock() - start
        self.counters["steps"] += 1
        self.counters["train_rows"] += len(per)
        self.last = {"proxy_loss": value}
        if main_losses is not None:
            mine = per.detach()
            mine = mine if self.train_on == "selected" else mine[torch.as_tensor(chosen, device=mine.device)]
            mine = to_numpy(mine, "proxy losses").astype(np.float64)
            if self.irreducible is not None:
                mine = mine - self.irreducible.irreducible[self._indices(indices, len(chosen))]
            rho = rank_correlation(mine, main)
            self.last["rank_correlation"] = rho
            if not math.isnan(rho):
                self.correlations.append(rho)
                self.counters["correlated_steps"] += 1
        return value

    def stats(self) -> dict[str, float]:
        """The proxy's cost and how well it tracks the main model.

        ``score_s``, ``train_s``, ``seconds``: its seconds scoring and training (host seconds; on CUDA with
        ``sync_timing`` device seconds); ``score_rows`` (no-grad forward rows), ``train_rows`` (forward +
        backward rows), ``forward_rows`` (both); ``pools``, ``steps``; ``rank_correlation``: the mean Spearman
        correlation, over the last ``window`` steps, between the proxy's losses and the main model's on the rows
        the main model trained on (``rank_correlation_last``: the latest; NaN before any). Measured on the rows
        the proxy chose, so a top-k selection (a narrow slice of the pool) lowers it below the correlation over
        the whole pool. ``proxy_loss``: the proxy's latest training loss."""
        c = self.counters
        mean = float(np.mean(self.correlations)) if self.correlations else math.nan
        return {**c, "forward_rows": c["score_rows"] + c["train_rows"], **self.seconds,
                "seconds": sum(self.seconds.values()), "rank_correlation": mean,
                "rank_correlation_last": self.last.get("rank_correlation", math.nan),
                "proxy_loss": self.last.get("proxy_loss", math.nan)}

    def state_dict(self) -> dict:
        """The proxy's weights and optimizer state, its counters and recent correlations."""
        return {"version": STATE_VERSION, "config": {"train_on": self.train_on},
                "model": {key: value.detach().clone() for key, value in self.model.state_dict().items()},
                "optimizer": copy.deepcopy(self.optimizer.state_dict()), "counters": dict(self.counters),
                "seconds": dict(self.seconds), "correlations": list(self.correlations)}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore a `state_dict` (same ``train_on``, same proxy layout, an optimizer of the same groups). A bad
        state raises `InvalidState` and changes nothing (model and optimizer are put back if either rejects)."""
        where = check_header(state, STATE_VERSION, {"train_on": self.train_on}, "ProxyScorer")
        weights = field(state, "model", where)
        require(isinstance(weights, Mapping), f"{where}['model'] must be a mapping, got {type(weights).__name__}")
        check_layout(weights, layout(self.model), f"{where}['model']", InvalidState)
        optimizer_state = field(state, "optimizer", where)
        require(isinstance(optimizer_state, Mapping), f"{where}['optimizer'] must be a mapping")
        counters, seconds = _meters(state, where, _PROXY_COUNTERS, _PROXY_SECONDS)
        saved = field(state, "correlations", where)
        require(isinstance(saved, (list, tuple)) and all(isinstance(x, (int, float)) and -1.0 <= x <= 1.0
                                                         for x in saved),
                f"{where}['correlations'] must be a list of correlations in [-1, 1]")
        correlations = [float(x) for x in saved][-self.window:]
        before_model = {key: value.detach().clone() for key, value in self.model.state_dict().items()}
        before_optimizer = copy.deepcopy(self.optimizer.state_dict())
        try:
            self.model.load_state_dict(weights)
            self.optimizer.load_state_dict(copy.deepcopy(dict(optimizer_state)))
        except (RuntimeError, ValueError, KeyError, TypeError) as exc:
            self.model.load_state_dict(before_model)
            self.optimizer.load_state_dict(before_optimizer)
            raise InvalidState(f"{where}: the proxy or its optimizer rejected the checkpoint: {exc}") from exc
        self.counters = counters
        self.seconds = seconds
        self.correlations = deque(correlations, maxlen=self.window)
        self.last = {}
