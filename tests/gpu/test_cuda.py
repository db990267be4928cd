"""CUDA checks: storage on the device, feedback as CUDA tensors, pinned-memory loading, pretraining of every variant
in fp32 and bf16 (with and without torch.compile), NCCL, export + fine-tuning.

Run by `checks/gpu_check.py` on a GPU machine; skipped where CUDA is missing (so CI collects them and skips).
"""
from __future__ import annotations

import json
import math
import os
import socket

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

from replayloader import PrioritizedSampler, ReplayBuffer, ReplayDataLoader  # noqa: E402
from replayloader.loader.host_sync import count_host_transfers  # noqa: E402
from replayloader.strategies import by_name, strategy_names  # noqa: E402

CUDA = torch.device("cuda")
FEEDBACK_KEY = {"per": "weight", "grad_norm": "grad_norm", "grad_bound": "grad_bound"}  # every other: loss


def cuda_batch(n: int, seed: int) -> dict:
    generator = torch.Generator(device="cuda").manual_seed(seed)
    return {"input_ids": torch.randint(0, 100, (n, 16), device=CUDA, generator=generator),
            "attention_mask": torch.ones(n, 16, device=CUDA, dtype=torch.long)}


@pytest.mark.parametrize("name", strategy_names())
def test_cuda_storage_keeps_examples_on_the_device(name):
    buffer = ReplayBuffer(256, beta=0.4, strategy=by_name(name), seed=0)
    reads_features = buffer.strategy.init.feature_based  # lsr / linucb read token ids on the host by design
    for step in range(6):
        with count_host_transfers("cuda") as moves:
            buffer.add(cuda_batch(64, step))
            sample = buffer.sample(32)
        assert all(value.device.type == "cuda" for value in sample.data.values())
        if not reads_features:
            assert not moves, f"examples left the device: {dict(moves)}"
        values = torch.rand(32, device=CUDA) + 0.01
        buffer.feedback(sample.ids, **{FEEDBACK_KEY.get(name, "loss"): values})
    assert buffer.storage.fields["input_ids"].device.type == "cuda"


def _loader_run(defer: bool):
    state = {"step": 0}

    def producer():
        state["step"] += 1
        return cuda_batch(16, state["step"])

    buffer = ReplayBuffer(128, alpha=0.8, strategy=by_name("loss_diff"), seed=1)
    loader = ReplayDataLoader(producer, buffer, batch_size=16, steps=20, defer_feedback=defer)
    ids, moves_per_step = [], []
    for batch in loader:
        with count_host_transfers("cuda") as moves:
            loss = batch.data["input_ids"].float().mean(dim=1) / 100  # a loss computed on the device
            loader.feedback(batch, loss=loss)
        moves_per_step.append(sum(moves.values()))
        ids.append(batch.ids.copy())
    loader.flush_feedback()
    return ids, moves_per_step, buffer.weights.copy()


def test_cuda_feedback_deferred_equals_synchronous_and_skips_the_wait():
    sync_ids, sync_moves, sync_weights = _loader_run(defer=False)
    deferred_ids, deferred_moves, deferred_weights = _loader_run(defer=True)
    for a, b in zip(sync_ids, deferred_ids):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(sync_weights, deferred_weights)
    assert min(sync_moves) >= 1  # the synchronous feedback copies (and waits) in the step
    assert max(deferred_moves) == 0  # the deferred one only starts a non-blocking copy


def test_batch_sampler_with_pinned_memory_feeds_cuda():
    from torch.utils.data import DataLoader, TensorDataset

    from replayloader import PrioritizedBatchSampler
    from replayloader.distributed import fork_safe_context

    n = 512
    data = TensorDataset(torch.arange(n, dtype=torch.float32)[:, None], torch.arange(n))
    batches = PrioritizedBatchSampler(PrioritizedSampler(n, 64, seed=0, warmup_epochs=1))
    # a process with CUDA initialised has driver threads: workers are spawned, not forked (the library's rule)
    loader = DataLoader(data, batch_sampler=batches, pin_memory=True, num_workers=2, persistent_workers=True,
                        multiprocessing_context=fork_safe_context(2))
    for epoch in range(2):
        for x, index in loader:
            assert x.is_pinned()
            x = x.to(CUDA, non_blocking=True)
            info = batches.next_batch_info()
            np.testing.assert_array_equal(info.indices, index.numpy())
            batches.feedback(info, loss=(x[:, 0] / n + 0.01))
    assert batches.sampler.measured.all()


# ------------------------------------------------------------------------------------------- pretraining
@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    pytest.importorskip("replayloader_electra", reason="the ELECTRA integration is not installed")
    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    words = ["the", "a", "cat", "dog", "sat", "on", "mat", "ran", "to", "house", "big", "small", "red", "blue",
             "and", "but", "then", "saw", "bird", "tree", "under", "over", "green", "old"]
    (root / "corpus.txt").write_text("\n".join(" ".join(rng.choice(words, size=12)) + "." for _ in range(800)))
    return {"file": str(root / "corpus.txt"), "cache": str(root / "cache")}


def _pretrain(corpus, out, device, **overrides):
    from replayloader_electra.pretrain.config import PretrainConfig
    from replayloader_electra.pretrain.loop import pretrain
    from replayloader_electra.pretrain.metrics import read_metrics

    settings = dict(preset="tiny", corpus=corpus["file"], vocab_size=200, max_len=32, batch_size=8, steps=4,
                    buffer_size=32, warmup_steps=1, output_dir=str(out), cache_dir=corpus["cache"], progress=False,
                    export_hf=False, device=device, seed=0)
    settings.update(overrides)
    return read_metrics(pretrain(PretrainConfig(**settings)).metrics_path)


VARIANTS = ["electra", "tmr-loss_diff", "tmr-grad_norm", "tmr-grad_bound", "tmr-lsr", "tmr-linucb"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_pretraining_on_cuda_matches_the_cpu_run_at_the_first_step(corpus, tmp_path, variant):
    cpu = _pretrain(corpus, tmp_path / "cpu", "cpu", variant=variant)
    gpu = _pretrain(corpus, tmp_path / "gpu", "cuda", variant=variant)
    assert all(math.isfinite(r["loss"]) for r in gpu)
    # Same seed, same data, same initial weights: the first step's loss differs only by kernel rounding.
    assert math.isclose(gpu[0]["loss"], cpu[0]["loss"], rel_tol=2e-3), (gpu[0]["loss"], cpu[0]["loss"])


@pytest.mark.parametrize("amp,compile_", [("bf16", False), ("none", True), ("bf16", True)])
@pytest.mark.parametrize("variant", ["tmr-loss_diff", "tmr-grad_norm", "tmr-grad_bound"])
def test_pretraining_on_cuda_with_autocast_and_compile(corpus, tmp_path, variant, amp, compile_):
    fp32 = _pretrain(corpus, tmp_path / "fp32", "cuda", variant=variant)
    other = _pretrain(corpus, tmp_path / "other", "cuda", variant=variant, amp=amp, compile=compile_)
    assert all(math.isfinite(r["loss"]) for r in other)
    tolerance = 5e-2 if amp == "bf16" else 1e-2
    assert math.isclose(other[0]["loss"], fp32[0]["loss"], rel_tol=tolerance), (other[0]["loss"], fp32[0]["loss"])


def test_export_and_fine_tune_on_cuda(corpus, tmp_path):
    """A pretrained discriminator exported as a Hugging Face directory loads on CUDA and takes training steps."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    _pretrain(corpus, tmp_path / "run", "cuda", export_hf=True)
    exported = [p for p in (tmp_path / "run").rglob("config.json") if "discriminator" in str(p)]
    assert exported, "no exported discriminator directory"
    directory = exported[0].parent
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForSequenceClassification.from_pretrained(directory, num_labels=2).to(CUDA)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    texts = ["the cat sat on the mat.", "a dog ran to the house."] * 4
    labels = torch.tensor([0, 1] * 4, device=CUDA)
    inputs = tokenizer(texts, return_tensors="pt", padding=True).to(CUDA)
    losses = []
    for _ in range(20):
        loss = model(**inputs, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0]


# ------------------------------------------------------------------------------------------- NCCL
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_nccl_initialises_in_one_process():
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    try:
        value = torch.ones(4, device=CUDA)
        dist.all_reduce(value)
        assert value.tolist() == [1.0] * 4
    finally:
        dist.destroy_process_group()


def _nccl_worker(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2)
    value = torch.full((2,), float(rank + 1), device=f"cuda:{rank}")
    dist.all_reduce(value)
    with open(f"{out}.{rank}", "w") as f:
        json.dump(value.tolist(), f)
    dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_nccl_all_reduce_across_two_processes(tmp_path):
    import torch.multiprocessing as mp

    out = str(tmp_path / "sum")
    mp.spawn(_nccl_worker, args=(_free_port(), out), nprocs=2, join=True)
    for rank in range(2):
        assert json.loads(open(f"{out}.{rank}").read()) == [3.0, 3.0]
