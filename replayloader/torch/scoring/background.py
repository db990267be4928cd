"""`BackgroundScorer`: a copy of the model scores pool t+1 (on a thread, a side CUDA stream, another device or a
worker process) while the trainer trains on pool t; the weights that score a pool are fixed by the order of the
calls, never by timing."""
from __future__ import annotations

import copy
import itertools
import pickle
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ... import _checks as checks
from ...loader.workers import WorkerError
from ...state.checks import InvalidState, check_header, field, integer as state_integer, number as state_number, \
    require
from .batches import batch_rows, first_tensor, model_device, unwrapped
from .checkpoints import STATE_VERSION, check_layout, layout, meters
from .streams import adopted, cuda_event
from .worker import Handles, ScoreFn, serve, serve_process, shutdown

Mode = Literal["thread", "process", "stream"]
MODES = ("thread", "process", "stream")


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
        self._finalizer = weakref.finalize(self, shutdown, self._handles)

    # -------------------------------------------------------------------------------------------- the worker
    def _start(self, scorer: torch.nn.Module, score_fn: ScoreFn, timeout: float) -> Handles:
        if self.mode == "process":
            import torch.multiprocessing as mp

            try:  # by value: shared memory would start multiprocessing's fd-sharing thread in this process
                packed = pickle.dumps((scorer, score_fn), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:
                raise ValueError(f"mode='process' sends score_fn and the model to a worker process, so both must "
                                 f"pickle (score_fn a module-level function): {exc}") from exc
            context = mp.get_context("spawn")
            jobs, results = context.Queue(), context.Queue()
            worker = context.Process(target=serve_process, args=(jobs, results, packed, self.threads),
                                     daemon=True, name="replayloader-scorer")
            handles = Handles(jobs, results, worker, True)
            worker.start()
            return self._ready(handles, timeout)  # the worker imports torch first: seconds
        jobs, results = queue.SimpleQueue(), queue.SimpleQueue()
        worker = threading.Thread(target=serve, name="replayloader-scorer", daemon=True,
                                  args=(jobs, results, scorer, score_fn, self.device, self.mode == "stream",
                                        self.threads))
        mine = torch.get_num_threads()
        worker.start()
        try:
            return self._ready(Handles(jobs, results, worker, False), timeout)
        finally:
            if self.threads is not None:
                # torch.set_num_threads on the worker also set the default of threads started later; give that
                # back (this thread's own count is unchanged; the worker keeps its own)
                torch.set_num_threads(mine)

    @staticmethod
    def _ready(handles: Handles, timeout: float) -> Handles:
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
                    shutdown(handles, 1.0)
                    raise WorkerError(message) from None
        if not ok:
            shutdown(handles, 1.0)
            raise WorkerError(f"the scorer's worker failed to start:\n{error}")
        return handles

    def _put(self, kind: str, payload: Any, rows: int | None = None, event: Any = None) -> int:
        if self.mode == "process" and payload is not None:
            payload = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)  # by value, see `worker.serve`
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
        counters, seconds = meters(state, where, _COUNTERS, _SECONDS)
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
