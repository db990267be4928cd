"""ELECTRA and TMR pretraining: one loop for every variant, read top to bottom.

One step (TMR, paper §"Joint Learning"):

    raw batch ─► mask 15% ─► generator ─► Gumbel-max sample (no grad) ─► corrupted batch ─► buffer.add
                                   │                                                          │
                                   L_G                                buffer.sample(K) ─► discriminator ─► L_D
    loss = L_G + 50·L_D ─► backward ─► clip 1.0 ─► AdamW ─► per-example feedback ─► buffer weights

`replayloader.ReplayDataLoader` drives the first line: its ``source`` is the stream of raw batches, its producer
masks and corrupts them, and the batches it yields carry L_G (graph still alive for the joint backward) as
``aux``. ELECTRA is the same loop with the ``none`` strategy: the discriminator gets exactly the batch just
produced. The loop knows no strategy: the feedback object chosen at setup says what goes back to the buffer.
Under torchrun the same loop runs on every rank; the few places where ranks meet are calls on the run's
`distributed.World` (a one-process world changes nothing).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from replayloader import ReplayBuffer, ReplayDataLoader
from replayloader.state import atomic_write_text

from transformers import get_linear_schedule_with_warmup

from ..errors import UserError
from ..runtime import Autocast, set_seed
from ..data import BatchStream, prepare_pretraining_data
from ..models import PairPart, build_electra_pair
from .checkpoint import (Checkpoint, check_same_run, choose_checkpoint, export_pair, load_checkpoint,
                         prune_checkpoints, save_checkpoint)
from .config import PretrainConfig, buffer_strategy, model_preset
from .corruption import CorruptionProducer, SpecialIds
from .delay import delayed
from .distributed import make_world
from .feedback import make_feedback
from .heldout import HELDOUT_METRICS, HeldoutSet, evaluate_heldout
from .losses import discriminator_losses, make_optimizer
from .metrics import MetricsLog, plot_metrics, read_metrics, step_record, summarize


@dataclass
class PretrainResult:
    config: PretrainConfig
    output_dir: str
    discriminator_dir: str | None
    metrics_path: str
    plot_path: str
    summary: dict = field(default_factory=dict)
    losses: list[float] = field(default_factory=list)
    is_main: bool = True  # False on torchrun's other ranks: rank 0 exports, summarizes and reports


def pretrain(config: PretrainConfig) -> PretrainResult:
    """Run one pretraining run (from ``config.resume``'s checkpoint when set; see `resume_config`)."""
    cfg = config.filled()
    world = make_world(cfg.device, cfg.dist_timeout)
    try:
        result = _pretrain(cfg, world)
    except BaseException:
        world.close(finished=False)
        raise
    world.close()
    return result


def resume_point(cfg: PretrainConfig, world) -> Checkpoint:
    """The checkpoint ``cfg.resume`` names, chosen and verified on rank 0 (the others get its answer, so every
    rank loads the same one), and checked to be of this run's preset and variant."""
    outcome: Checkpoint | UserError | None = None
    if world.is_main:
        try:
            outcome = choose_checkpoint(cfg.resume)
        except UserError as error:
            outcome = error
    outcome = world.share(outcome)
    if isinstance(outcome, UserError):
        raise outcome
    check_same_run(outcome, cfg.preset, cfg.variant)
    return outcome


def learning_rate_schedule(optimizer: torch.optim.Optimizer, cfg: PretrainConfig, step: int):
    """Linear warmup to ``cfg.learning_rate`` over ``cfg.warmup_steps``, then linear decay to 0 at ``cfg.steps``,
    positioned at ``step`` (the steps already taken).

    The schedule is a function of the run's options and the step, never restored from a checkpoint: resuming
    with the same options continues it exactly, and resuming a run with more ``--steps`` continues on the
    schedule of the new total from the current step (as if the run had been started with that total), so the
    first resumed step trains at that schedule's rate instead of the old schedule's final 0.
    """
    for group in optimizer.param_groups:
        group["initial_lr"] = cfg.learning_rate  # the peak; LambdaLR scales it by the schedule's factor
    return get_linear_schedule_with_warmup(optimizer, cfg.warmup_steps, cfg.steps, last_epoch=step - 1)


def _pretrain(cfg: PretrainConfig, world) -> PretrainResult:
    device = world.device(cfg.device)
    batch_size, buffer_size = world.per_rank(cfg.batch_size, cfg.buffer_size)
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    autocast = Autocast.choose(device, cfg.amp)  # a no-op off CUDA or with --amp none

    resumed = resume_point(cfg, world) if cfg.resume else None  # checked before any data is prepared

    # ---- data: tokenizer + packed examples (cached, memory-mapped), streamed as shuffled raw batches
    set_seed(cfg.seed)
    with world.main_first():  # rank 0 builds the cache, the others read it
        data = prepare_pretraining_data(cfg.corpus, cfg.cache_dir, cfg.vocab_size, cfg.max_len, cfg.corpus_config,
                                        cfg.tokenizer, cfg.max_lines)
    special = SpecialIds.from_tokenizer(data.tokenizer)
    heldout = HeldoutSet.load(cfg.heldout, data.tokenizer, device) if cfg.heldout else None
    stream = BatchStream(data.examples, batch_size, cfg.seed, special.pad, device, shard=(world.rank, world.size))

    # ---- models, optimizer, schedule, loss scaling (a no-op unless fp16 on CUDA)
    pair = build_electra_pair(model_preset(cfg), len(data.tokenizer), special.pad, cfg.dropout,
                              seed=cfg.seed).to(device)
    pair.train()
    buffer_seed = world.start_rank_streams(cfg.seed)  # same initial weights everywhere, then each rank's streams
    model = world.wrap(pair)  # DDP around both models: both passes below go through it
    optimizer = make_optimizer(pair, cfg.learning_rate, cfg.weight_decay)
    scaler = torch.amp.GradScaler(device.type, enabled=autocast.dtype == torch.float16)
    feedback = make_feedback(cfg, pair.discriminator)  # what goes back to the buffer, chosen once
    if cfg.compile and device.type == "cuda" and not feedback.needs_eager:
        model = torch.compile(model)  # a compiled view; `pair` keeps the eager modules and names
    generator, discriminator = PairPart(model, "generator"), PairPart(model, "discriminator")

    # ---- the memory buffer between generator and discriminator, and what goes back into it
    buffer = ReplayBuffer(buffer_size, alpha=cfg.alpha, beta=cfg.beta, strategy=buffer_strategy(cfg),
                          seed=buffer_seed)
    producer = delayed(CorruptionProducer(generator, special, cfg.mask_prob, cfg.mask_token_prob, autocast,
                                          cfg.replacements), cfg.delay_steps)  # --delay-steps: see delay.py
    loader = ReplayDataLoader(producer, buffer, batch_size=batch_size, source=stream, steps=cfg.steps,
                              defer_feedback=cfg.defer_feedback)

    start_step = 0
    if resumed is not None:
        start_step, loader_state = load_checkpoint(resumed.path, pair, optimizer, world, resumed.state)
        loader.load_state_dict(loader_state)
        if world.is_main:
            print(resumed.describe() + ("" if resumed.run_dir == out_dir else f"; writing to {out_dir}"), flush=True)
    scheduler = learning_rate_schedule(optimizer, cfg, start_step)
    if world.is_main:
        atomic_write_text(out_dir / "config.json", json.dumps(cfg.to_json(), indent=1))
    log = MetricsLog(out_dir / "metrics.jsonl", start_step if resumed is not None else None, enabled=world.is_main)

    from ..output import progress_bar  # quiet when the output is not a terminal

    bar = progress_bar(enabled=cfg.progress and world.is_main, total=cfg.steps, initial=start_step,
                       desc=cfg.variant, unit="step", dynamic_ncols=True)
    weighted = cfg.beta is not None  # importance weights in the loss: decided once (the paper uses none)
    run_started = step_started = time.perf_counter()
    try:
        for batch in loader:  # source -> producer (mask + generator + sampling) -> buffer.add -> buffer.sample
            weights = torch.as_tensor(batch.weights, dtype=torch.float32, device=device) if weighted else None
            # ---- discriminator on the sampled batch; joint loss L_G + λ·L_D
            with feedback.recording():
                d = discriminator_losses(discriminator, batch.data, weights, autocast())
            generator_loss = batch.aux["generator_loss"]
            loss = generator_loss + cfg.discriminator_weight * d.loss
            # each rank's share of the global means (1, 1 in one process), so DDP's gradient average is exact
            share_g, share_d = world.loss_shares(batch.aux["masked_tokens"], d.mask.sum())
            rank_loss = share_g * generator_loss + cfg.discriminator_weight * (share_d * d.loss)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(rank_loss).backward()
            scaler.unscale_(optimizer)
            total_grad_norm = torch.nn.utils.clip_grad_norm_(pair.parameters(), cfg.clip_norm)
            scaler.step(optimizer)
            scaler.update()
            lr = scheduler.get_last_lr()[0]  # the rate this step used (read before the scheduler advances)
            scheduler.step()

            # ---- per-example signal back to the buffer (one kind, chosen at setup)
            signals = feedback.signals(batch.data, d, scaler.get_scale() * share_d)
            loader.feedback(batch, **signals)

            # ---- metrics and checkpoints; a step that logs nothing reads nothing off the device (--log-every)
            step = batch.produced  # one producer call per training step
            scores = heldout is not None and (step % cfg.heldout_every == 0 or step == cfg.steps)
            saves = (cfg.checkpoint_every and step % cfg.checkpoint_every == 0) or step == cfg.steps
            if scores or saves or step % cfg.log_every == 0:
                seconds = {"data_seconds": stream.last_seconds, "step_seconds": time.perf_counter() - step_started}
                record = step_record(step, lr, loss, generator_loss, d, batch, feedback.report(signals, d),
                                     total_grad_norm, buffer.stats(), seconds)
                if scores:  # the replicas are identical, so rank 0 alone scores; the others' None drops out
                    scoring_started = time.perf_counter()
                    record.update(evaluate_heldout(pair.discriminator, heldout, autocast=autocast) if world.is_main
                                  else dict.fromkeys(HELDOUT_METRICS))
                    # not in step_seconds: a run's wall time is its steps plus these scoring passes
                    record["heldout_seconds"] = time.perf_counter() - scoring_started if world.is_main else None
                record = world.reduce_record(record)
                log.write(record)
                bar.update(step - bar.n)
                bar.set_postfix(loss=f"{record['loss']:.3f}", G=f"{record['generator_loss']:.2f}",
                                D=f"{record['discriminator_loss']:.3f}", refresh=False)
            if saves:
                save_checkpoint(out_dir / "checkpoints", step, cfg, pair, optimizer, scheduler,
                                loader.state_dict(), world)
                if world.is_main:
                    prune_checkpoints(out_dir / "checkpoints", cfg.keep_checkpoints)
            step_started = time.perf_counter()
    finally:
        bar.close()
        log.close()
        feedback.close()
    wall = time.perf_counter() - run_started
    if not world.is_main:  # rank 0 exports and summarizes
        return PretrainResult(cfg, str(out_dir), None, str(out_dir / "metrics.jsonl"), "", is_main=False)

    # ---- exports: HF directories for fine-tuning, curves, summary
    discriminator_dir = export_pair(pair, data.tokenizer, out_dir) if cfg.export_hf else None
    records = read_metrics(out_dir / "metrics.jsonl")
    plot_path = out_dir / "losses.png"
    plot_metrics({cfg.variant: records}, plot_path)
    summary = {"variant": cfg.variant, "preset": cfg.preset, "corpus": cfg.corpus, "device": str(device),
               "torch_threads": torch.get_num_threads(), "ranks": world.size, "examples": len(data),
               "corpus_tokens": data.num_tokens, "data_prepare_seconds": data.prepare_seconds,
               "wall_seconds_this_session": wall, **summarize(records)}
    atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=1))  # a job queue's "done" mark
    return PretrainResult(cfg, str(out_dir), discriminator_dir, str(out_dir / "metrics.jsonl"), str(plot_path),
                          summary, [r["loss"] for r in records])
