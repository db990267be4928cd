"""What every rank runs in the distributed tests: ``python jobs.py OUT JOB [JOB...]`` under a launcher.

Each job returns a JSON-able dict; rank r writes ``OUT/report-r.json`` with one entry per job.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from replayloader.distributed import fork_safe_context, shutdown, state_digest, verify_identical

ROOT = Path(__file__).resolve().parents[2]

HF_EXAMPLES = 80
HF_BATCH = 8  # the global batch: 4 per rank on 2 ranks


# ----------------------------------------------------------------------------- Hugging Face Trainer
class IndexedTexts(torch.utils.data.Dataset):
    """Tiny token sequences whose dataset index travels with the batch, so a rank can check which examples it got."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(5, 50, (n, 8), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(8, dtype=torch.long), "labels": self.labels[i],
                "index": torch.tensor(i)}


def tiny_bert(out: Path) -> tuple:
    """The tiny BERT classifier and the TrainingArguments (2 epochs, gloo on CPU) of the Trainer jobs."""
    from transformers import BertConfig, BertForSequenceClassification, TrainingArguments

    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16, num_labels=2)
    args = TrainingArguments(output_dir=str(out / "hf"), num_train_epochs=2, learning_rate=1e-3, use_cpu=True,
                             report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True,
                             ddp_backend="gloo", seed=0)
    return BertForSequenceClassification(config), args


def observed(trainer_class: type, seen: list) -> type:
    """``trainer_class`` recording the dataset indices of each batch it receives (the ``index`` column)."""

    class Observed(trainer_class):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            inputs = dict(inputs)
            seen.append(inputs.pop("index").tolist())
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    return Observed


def hf_trainer(out: Path) -> dict:
    """`PrioritizedTrainer` for 2 epochs (the warm-up pass, then a prioritized one). Per step: the dataset indices
    of the batch the rank trained on, and the indices its feedback was given for; at the end the weights."""
    from replayloader import PrioritizedSampler
    from replayloader.torch.hf import PrioritizedTrainer

    seen: list[list[int]] = []
    fed: list[list[int]] = []
    model, args = tiny_bert(out)
    sampler = PrioritizedSampler(HF_EXAMPLES, batch_size=HF_BATCH, beta=0.5, uniform_fraction=0.1, seed=0)
    trainer = observed(PrioritizedTrainer, seen)(model=model, args=args, train_dataset=IndexedTexts(HF_EXAMPLES),
                                                 sampler=sampler)
    original = trainer.batch_sampler.feedback

    def observed_feedback(batch, **feedback):
        fed.append(np.asarray(batch.indices).tolist())
        return original(batch, **feedback)

    trainer.batch_sampler.feedback = observed_feedback
    trainer.train()
    return {"seen": seen, "fed": fed, "weights": sampler.weights.tolist(), "visits": sampler.visits.tolist()}


def hf_select(out: Path) -> dict:
    """`SelectingTrainer` for 2 epochs: n_B = 8 candidates (4 per rank), n_b = 4 chosen (2 per rank). Per step:
    the candidates the rank received, the candidates it scored and the rows it chose; the shared state's digest."""
    from replayloader import PrioritizedSampler
    from replayloader.torch.hf import SelectingTrainer
    from replayloader.selection import Selector, TopK

    seen: list[list[int]] = []
    scored: list[list[int]] = []
    chosen: list[list[int]] = []
    model, args = tiny_bert(out)
    sampler = PrioritizedSampler(HF_EXAMPLES, batch_size=HF_BATCH, beta=0.5, uniform_fraction=0.1, seed=0)
    trainer = observed(SelectingTrainer, seen)(model=model, args=args, train_dataset=IndexedTexts(HF_EXAMPLES),
                                               sampler=sampler, selector=Selector(TopK(HF_BATCH // 2), seed=0))
    choose = trainer.batch_sampler.choose

    def observed_choose(candidates, losses):
        selection = choose(candidates, losses)
        scored.append(candidates.indices.tolist())
        chosen.append(selection.indices.tolist())
        return selection

    trainer.batch_sampler.choose = observed_choose
    trainer.train()
    return {"seen": seen, "scored": scored, "chosen": chosen,
            "state": verify_identical(trainer.batch_sampler.select.state_dict())}


# ----------------------------------------------------------------------------- Lightning
LIGHTNING_EXAMPLES, LIGHTNING_BATCH, LIGHTNING_EPOCHS = 64, 16, 3


def lightning(out: Path) -> dict:
    """`PrioritizedModule` under ``Trainer(strategy="ddp")`` for 3 epochs, checkpointing every epoch; then a second
    run resumed from the checkpoint after epoch 2 (index 1). Per step: the indices trained on and fed back.
    Started as ``python jobs.py OUT lightning``: Lightning's launcher re-runs the command for the second rank."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.nn import functional as F

    from replayloader import PrioritizedSampler
    from replayloader.torch.lightning import PrioritizedModule

    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(LIGHTNING_EXAMPLES, 4, generator=g),
                                          torch.randint(0, 2, (LIGHTNING_EXAMPLES,), generator=g),
                                          torch.arange(LIGHTNING_EXAMPLES))

    class Model(PrioritizedModule):
        def __init__(self) -> None:
            super().__init__(PrioritizedSampler(LIGHTNING_EXAMPLES, batch_size=LIGHTNING_BATCH, beta=0.5,
                                                uniform_fraction=0.1, seed=0))
            torch.manual_seed(0)
            self.net = torch.nn.Linear(4, 2)
            self.steps: list[dict] = []

        def train_dataloader(self):
            return self.prioritized_dataloader(data)

        def training_step(self, batch, batch_idx):
            x, y, index = batch
            info = self.batch_info()
            per_example = F.cross_entropy(self.net(x), y, reduction="none")
            self.steps.append({"seen": index.tolist(), "fed": info.indices.tolist(), "epoch": info.epoch,
                               "weights": info.weights.tolist()})
            return self.prioritized_loss(info, per_example)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def fit(model: Model, run: str, ckpt_path: Path | None = None) -> None:
        trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", use_distributed_sampler=False,
                             max_epochs=LIGHTNING_EPOCHS, logger=False, enable_progress_bar=False,
                             enable_model_summary=False, default_root_dir=str(out),
                             callbacks=[ModelCheckpoint(dirpath=str(out / run), filename="{epoch}", save_top_k=-1)])
        trainer.fit(model, ckpt_path=ckpt_path)

    full, resumed = Model(), Model()
    fit(full, "lightning")
    fit(resumed, "lightning_resumed", out / "lightning" / "epoch=1.ckpt")
    return {"full": full.steps, "resumed": resumed.steps, "weights": full.sampler.weights.tolist(),
            "resumed_weights": resumed.sampler.weights.tolist()}


# ----------------------------------------------------------------------------- the torchrun examples of docs/distributed.md
def readme_example(out: Path, heading: str) -> dict:
    """Run the first python block after ``heading`` in docs/distributed.md as written (it starts the process
    group through `session`) in ``out``; return its namespace."""
    from tests.docs_blocks import block as docs_block

    block = docs_block("docs/distributed.md", heading)
    namespace: dict = {"__name__": "__main__"}  # the block runs as the launched script
    here = os.getcwd()
    os.chdir(out)
    # The block's `session` starts the group unless one exists, and then also destroys it at its end; starting
    # the default group again after that under torchrun hung in 2 of 3 tries. So the group exists first, and
    # `session` leaves it as it found it (its own exit is tested standalone in test_lifecycle.py).
    ensure_group()
    try:
        exec(compile(block, f"docs {heading} example", "exec"), namespace)
    finally:
        os.chdir(here)
    return namespace


def parameters(model: torch.nn.Module) -> list[float]:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def readme(out: Path) -> dict:
    """The sampler recipe of docs/distributed.md."""
    namespace = readme_example(out, "**Prioritized sampling over a fixed dataset under DDP**")
    return {"weights": namespace["sampler"].weights.tolist(), "epoch": namespace["sampler"].epoch,
            "parameters": parameters(namespace["model"].module)}


def readme_select(out: Path) -> dict:
    """The score-then-select recipe of docs/distributed.md."""
    namespace = readme_example(out, "**Score-then-select under DDP**")
    return {"weights": namespace["sampler"].weights.tolist(), "epoch": namespace["sampler"].epoch,
            "parameters": parameters(namespace["model"].module),
            "stats": namespace["batches"].select.selector.stats()}


# ----------------------------------------------------------------------------- the sampler's own checks
def core(out: Path) -> dict:
    """Equivalence run, checkpoint + resume (same world size, and from a one-process file), bad input."""
    from replayloader import PrioritizedBatchSampler
    from replayloader.distributed import DistributedPrioritizedSampler, load_shared_state, save_shared_state
    from tests.distributed import scenario as sc

    ensure_group()
    steps = sc.EPOCHS * sc.STEPS_PER_EPOCH
    report = {"equivalence": sc.drive(DistributedPrioritizedSampler(sc.make_sampler()), steps),
              "equivalence_overlap": sc.drive(DistributedPrioritizedSampler(sc.make_sampler(), overlap=True), steps)}
    batches = PrioritizedBatchSampler(DistributedPrioritizedSampler(sc.make_sampler()))

    def save(count: int) -> None:
        if count == sc.SAVE_AT:
            save_shared_state(batches.state_dict(), out / "two_ranks.npz")

    report["uninterrupted"] = sc.train(batches, sc.TOTAL, on_step=save)
    for name, path in (("resumed", "two_ranks.npz"), ("from_one_process", "one_process.npz")):
        resumed = PrioritizedBatchSampler(DistributedPrioritizedSampler(sc.make_sampler()))
        resumed.load_state_dict(load_shared_state(out / path))
        report[name] = sc.train(resumed, sc.TOTAL - sc.SAVE_AT)
    report["ragged"] = ragged()
    report["errors"] = bad_input(out)
    return report


def ragged() -> dict:
    """Ranks feeding back different amounts: rank 1 sends the whole global batch as plain indices (longer than a
    gathered row: the wider second gather), then nothing (``update(None)``) while rank 0 sends its share."""
    from replayloader.distributed import DistributedPrioritizedSampler
    from tests.distributed import scenario as sc

    rank = dist.get_rank()
    shared = DistributedPrioritizedSampler(sc.make_sampler())
    batch = shared.next_batch()
    if rank == 0:
        shared.feedback(batch, loss=sc.loss_of(batch.indices, batch.epoch))
    else:
        shared.feedback(batch.whole.indices, loss=sc.loss_of(batch.whole.indices, batch.epoch))
    batch = shared.next_batch()
    shared.feedback(batch if rank == 0 else None, **({"loss": sc.loss_of(batch.indices, batch.epoch)}
                                                   if rank == 0 else {}))
    return {"digest": state_digest(shared.state_dict()), "gathers": shared.counters["feedback_gathers"],
            "bytes": shared.counters["gathered_bytes"], "width": shared.gather_width}


def error_of(action) -> str | None:
    try:
        action()
    except (ValueError, TypeError, RuntimeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def bad_input(out: Path) -> dict:
    """Every rank reports what each bad call raised on it (None: nothing raised)."""
    from replayloader.distributed import DistributedPrioritizedSampler as Shared
    from replayloader.distributed import save_shared_state
    from tests.distributed import scenario as sc

    rank = dist.get_rank()
    errors = {
        "num_examples": error_of(lambda: Shared(sc.make_sampler(num_examples=sc.N + rank))),
        "seed": error_of(lambda: Shared(sc.make_sampler(seed=rank))),
        "seed_none": error_of(lambda: Shared(sc.make_sampler(seed=None))),
        "alpha": error_of(lambda: Shared(sc.make_sampler(alpha=1.0 + rank))),
        "dataset_size": error_of(lambda: Shared(sc.make_sampler(), dataset_size=sc.N + rank)),
        "batch_size": error_of(lambda: Shared(sc.make_sampler(batch_size=7))),
    }
    shared = Shared(sc.make_sampler())
    batch = shared.next_batch()
    before = state_digest(shared.state_dict())
    loss = sc.loss_of(batch.indices, batch.epoch)
    bad = loss.copy()
    bad[0] = np.nan if rank == 1 else bad[0]
    errors["nan_on_rank_1"] = error_of(lambda: shared.feedback(batch, loss=bad))
    errors["unchanged_after_rejection"] = state_digest(shared.state_dict()) == before
    errors["good_update_after_rejection"] = error_of(lambda: shared.feedback(batch, loss=loss))
    overlapped = Shared(sc.make_sampler(), overlap=True)
    drawn = overlapped.next_batch()
    errors["overlap_nan_on_rank_1"] = error_of(lambda: (overlapped.feedback(drawn, loss=bad), overlapped.next_batch()))
    if rank == 1:
        shared.next_batch()  # rank 1 runs ahead by one draw
    errors["diverged"] = error_of(lambda: shared.feedback(batch, loss=loss))
    errors["save_differs"] = error_of(lambda: save_shared_state(shared.state_dict(), out / "differs.npz"))
    errors["save_differs_wrote"] = (out / "differs.npz").exists()
    return errors


def ensure_group() -> None:
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))


# ----------------------------------------------------------------------------- score-then-select across ranks
def select(out: Path) -> dict:
    """`DistributedScoreThenSelect` with each rule over the warm-up and three epochs; the DataLoader recipe
    (`CandidateBatchSampler`) with a checkpoint after `SAVE_AT` steps, resumed on 2 ranks; bad input."""
    from replayloader.distributed import DistributedPrioritizedSampler, load_shared_state, save_shared_state
    from replayloader.distributed.select import DistributedScoreThenSelect
    from replayloader.torch.candidates import CandidateBatchSampler
    from tests.distributed import scenario as sc
    from tests.distributed import select_scenario as ss

    ensure_group()
    report = {}
    for rule in ss.RULES:
        chooser = DistributedScoreThenSelect(DistributedPrioritizedSampler(ss.make_sampler()), ss.make_selector(rule))
        records = ss.drive(chooser, ss.STEPS)
        report[rule] = {"records": records, "verified": verify_identical(chooser.state_dict()),
                        "sampler": state_digest(chooser.sampler.state_dict()),
                        "rng": chooser.selector.rng_state.tolist(),
                        "memory": {k: np.asarray(v).tolist() for k, v in chooser.selector.rule.state_dict().items()},
                        "counters": chooser.counters}

    def candidate_batches() -> CandidateBatchSampler:
        return CandidateBatchSampler(DistributedPrioritizedSampler(ss.make_sampler()), ss.make_selector("top_k"))

    batches = candidate_batches()

    def save(count: int) -> None:
        if count == ss.SAVE_AT:
            save_shared_state(batches.state_dict(), out / "select_loader.npz")

    report["loader"] = sc.run_loader(ss.loader(batches), batches, ss.TOTAL, ss.loader_step, save)
    report["loader_sampler"] = state_digest(batches.sampler.state_dict())
    resumed = candidate_batches()
    resumed.load_state_dict(load_shared_state(out / "select_loader.npz"))
    report["loader_resumed"] = sc.run_loader(ss.loader(resumed), resumed, ss.TOTAL - ss.SAVE_AT, ss.loader_step)
    report["loader_resumed_sampler"] = state_digest(resumed.sampler.state_dict())
    from_one = candidate_batches()  # a one-process checkpoint (conftest.py) continued on 2 ranks
    from_one.load_state_dict(load_shared_state(out / "select_one_process.npz"))
    report["loader_from_one_process"] = sc.run_loader(ss.loader(from_one), from_one, ss.TOTAL - ss.SAVE_AT,
                                                      ss.loader_step)
    report["resumed"] = select_resumed(out)
    report["errors"] = select_bad_input()
    return report


def select_resumed(out: Path) -> dict:
    """`DistributedScoreThenSelect` (SelectiveBackprop: a selector with memory) checkpointed to one file after
    `SAVE_AT` draws, continued, and a new one resumed from the file; a state of another rule is refused."""
    from replayloader.distributed import DistributedPrioritizedSampler, load_shared_state, save_shared_state
    from replayloader.distributed.select import DistributedScoreThenSelect
    from tests.distributed import select_scenario as ss

    def chooser(rule: str) -> DistributedScoreThenSelect:
        return DistributedScoreThenSelect(DistributedPrioritizedSampler(ss.make_sampler()), ss.make_selector(rule))

    first = chooser("selective_backprop")
    ss.drive(first, ss.SAVE_AT)
    save_shared_state(first.state_dict(), out / "select_direct.npz")
    report = {"continued": ss.drive(first, ss.STEPS - ss.SAVE_AT)}
    resumed = chooser("selective_backprop")
    resumed.load_state_dict(load_shared_state(out / "select_direct.npz"))
    report["resumed"] = ss.drive(resumed, ss.STEPS - ss.SAVE_AT)
    other = chooser("top_k")
    before = state_digest(other.state_dict())
    report["wrong_rule"] = error_of(lambda: other.load_state_dict(load_shared_state(out / "select_direct.npz")))
    report["wrong_rule_unchanged"] = state_digest(other.state_dict()) == before
    return report


def select_bad_input() -> dict:
    """Every rank reports what each bad call raised on it (None: nothing raised) and whether state changed."""
    from replayloader.distributed import DistributedPrioritizedSampler as Shared
    from replayloader.distributed.select import DistributedScoreThenSelect as Chooser
    from tests.distributed import select_scenario as ss

    rank = dist.get_rank()
    errors = {
        "k_not_divisible": error_of(lambda: Chooser(Shared(ss.make_sampler()), ss.make_selector("top_k", k=3))),
        "k_too_large": error_of(lambda: Chooser(Shared(ss.make_sampler()), ss.make_selector("top_k", k=10))),
        "seed": error_of(lambda: Chooser(Shared(ss.make_sampler()), ss.make_selector("top_k", seed=rank))),
        "not_distributed": error_of(lambda: Chooser(ss.make_sampler(), ss.make_selector("top_k"))),
    }
    chooser = Chooser(Shared(ss.make_sampler()), ss.make_selector("selective_backprop"))
    candidates = chooser.next_candidates()
    scores = ss.score_of(candidates.indices, candidates.epoch)
    before = state_digest(chooser.state_dict())
    calls = {"shape_on_rank_1": np.ones(len(scores) + rank),
             "nan_on_rank_0": np.where(np.arange(len(scores)) == 1, np.nan if rank == 0 else 0.0, scores)}
    for name, losses in calls.items():
        errors[name] = error_of(lambda: chooser.choose(candidates, losses))
        errors[name + "_unchanged"] = state_digest(chooser.state_dict()) == before
    errors["plain_batch"] = error_of(lambda: chooser.choose(candidates.whole, scores))
    errors["good_after_rejection"] = error_of(lambda: chooser.choose(candidates, scores))
    if rank == 1:
        chooser.next_candidates()  # rank 1 runs ahead by one draw
    errors["diverged"] = error_of(lambda: chooser.choose(candidates, scores))
    return errors


# ----------------------------------------------------------------------------- a rank that dies, and the resume
KILL_TOTAL, KILL_EVERY, KILL_AT = 24, 5, 13  # save every 5 steps; rank 1 dies at step 13 (last file: step 10)


def kill_run(out: Path, resume: bool = False, die: bool = False) -> dict:
    """A DataLoader loop (1 worker, 2 batches prefetched) over `DistributedPrioritizedSampler` that saves the
    shared state every `KILL_EVERY` steps to ``out/kill_state.npz``. ``die``: rank 1 SIGKILLs itself at step
    `KILL_AT` before its update, while rank 0 waits for it in the update's all-gather. ``resume``: start from
    the last state file. Returns the steps run (from ``start``) and the final sampler digest."""
    import signal

    from replayloader import PrioritizedBatchSampler
    from replayloader.distributed import DistributedPrioritizedSampler, load_shared_state, save_shared_state
    from tests.distributed import scenario as sc

    ensure_group()
    batches = PrioritizedBatchSampler(DistributedPrioritizedSampler(sc.make_sampler()))
    start = 0
    if resume:
        state = load_shared_state(out / "kill_state.npz")
        batches.load_state_dict(state["loader"])
        start = int(state["trained"])
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(sc.N)), batch_sampler=batches,
                                         num_workers=1, prefetch_factor=2,
                                         multiprocessing_context=fork_safe_context(1))  # never fork a rank

    def step(batches, info, batch) -> dict:
        assert batch[0].tolist() == info.indices.tolist()
        if die and dist.get_rank() == 1 and info.step + 1 == KILL_AT:  # info.step counts from 0
            (out / "killed_at").write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        return sc.feed_back(batches, info)

    def save(count: int) -> None:
        if (start + count) % KILL_EVERY == 0:
            save_shared_state({"loader": batches.state_dict(), "trained": start + count}, out / "kill_state.npz")

    records = sc.run_loader(loader, batches, KILL_TOTAL - start, step, save)
    return {"start": start, "records": records, "sampler": state_digest(batches.sampler.state_dict())}


def train_until_killed(out: Path) -> dict:
    """The docs' DDP sampler recipe's loop, forever: says it started, then trains until something stops it (the
    launcher-death test kills the launcher and expects the ranks to end by themselves)."""
    from replayloader import PrioritizedBatchSampler
    from replayloader.distributed import DistributedPrioritizedSampler
    from tests.distributed import scenario as sc

    ensure_group()
    batches = PrioritizedBatchSampler(DistributedPrioritizedSampler(sc.make_sampler()))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(sc.N)), batch_sampler=batches,
                                         num_workers=1, persistent_workers=True,
                                         multiprocessing_context=fork_safe_context(1))
    (out / f"started-{dist.get_rank()}").write_text(str(os.getpid()))
    while True:
        for _ in loader:
            sc.feed_back(batches, batches.next_batch_info())
            time.sleep(0.01)


JOBS = {"readme": readme, "forever": train_until_killed, "core": core, "hf_trainer": hf_trainer, "lightning": lightning, "select": select,
        "hf_select": hf_select, "readme_select": readme_select, "kill_steady": kill_run, "kill_die": lambda out: kill_run(out, die=True),
        "kill_resume": lambda out: kill_run(out, resume=True)}


def main() -> None:
    out, names = Path(sys.argv[1]), sys.argv[2:]
    torch.set_num_threads(1)
    report = {name: JOBS[name](out) for name in names}
    rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", 0)))  # Lightning's own launcher: LOCAL_RANK
    (out / f"report-{rank}.json").write_text(json.dumps(report))
    shutdown()  # barrier, destroy, gloo's workers parked: no abort at exit (replayloader/launcher.py)


if __name__ == "__main__":
    main()
