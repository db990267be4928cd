"""BackgroundScorer's worker: one loop (`serve`) that takes jobs in order and puts one answer per job, the same on
a thread and in a spawned process, and its shutdown (`shutdown`), held apart from the scorer so that garbage
collection can run it."""
from __future__ import annotations

import pickle
import queue
import threading
import time
import traceback
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch

from .batches import model_device, per_example, to_device

ScoreFn = Callable[[torch.nn.Module, Any], torch.Tensor]
STOP = "stop"


def serve(jobs: Any, results: Any, model: torch.nn.Module, score_fn: ScoreFn, device: torch.device,
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
            if job == STOP:
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


def serve_process(jobs: Any, results: Any, packed: bytes, threads: int | None) -> None:
    """A worker process's entry point (spawned: CPU only); ``packed`` is the pickled (model copy, score_fn)."""
    import multiprocessing

    model, score_fn = pickle.loads(packed)
    serve(jobs, results, model, score_fn, model_device(model), False, threads, multiprocessing.parent_process())


class Handles:
    """What the worker's shutdown needs, held apart from the scorer so that garbage collection can run it."""

    def __init__(self, jobs: Any, results: Any, worker: Any, process: bool) -> None:
        self.jobs, self.results, self.worker, self.process = jobs, results, worker, process


def shutdown(handles: Handles, timeout: float = 30.0) -> None:
    """Stop the worker and wait for it (a thread finishes the job in hand; a process is terminated after
    ``timeout`` seconds), then release the queues and their feeder threads."""
    worker = handles.worker
    if worker is None:
        return
    handles.worker = None
    try:
        if worker.is_alive():
            handles.jobs.put(STOP)
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
