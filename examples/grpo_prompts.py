"""GRPO with TRL on a CPU, prompts drawn uniformly (TRL's own sampler) or by learnability (PrioritizedGRPOTrainer).

The task: a prompt "d+k=" asks for the digit d written k times (k = 1, 2, 3: the difficulty), reward 1 for an exact
start. An untrained 2-layer GPT-2 (built from a config, with a character tokenizer made offline) solves k = 1 now and
then, k = 3 almost never: under uniform draws most groups of completions get the same reward and teach nothing.
The prioritized arm draws the prompts whose groups disagree (p(1-p), per prompt, shrunk toward its difficulty's
running mean) and logs the share of zero-variance groups; both arms report it, and the held-out pass rate per
difficulty at the end.

    pip install "replayloader[trl]" && python examples/grpo_prompts.py [--steps 150] [--plot pass_rates.png]
"""
from __future__ import annotations

import argparse
import tempfile

import numpy as np
import torch
from datasets import Dataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast, PrinterCallback, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from replayloader.prompts import PrioritizedGRPOTrainer, PromptSampler

VOCAB = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate("0123456789+=")}}
GENERATIONS, PROMPTS_PER_BATCH = 8, 8


def tokenizer() -> PreTrainedTokenizerFast:
    raw = Tokenizer(models.WordLevel(VOCAB, unk_token="<pad>"))
    raw.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # one token per character
    raw.decoder = decoders.Fuse()  # and back to text without spaces between them
    return PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", eos_token="<eos>")


def task(copies: int) -> Dataset:
    """Every (digit, count) pair ``copies`` times; all prompts have 4 characters (TRL pads on the left)."""
    rows = [(d, k) for _ in range(copies) for k in (1, 2, 3) for d in range(10)]
    return Dataset.from_dict({"prompt": [f"{d}+{k}=" for d, k in rows], "digit": [d for d, _ in rows],
                              "count": [k for _, k in rows]})


def exact_start(completions, digit, count, **kwargs):
    """1.0 when the completion starts with the digit written ``count`` times (TRL passes every dataset column)."""
    return [float(c.startswith(str(d) * k)) for c, d, k in zip(completions, digit, count)]


class PassRates(TrainerCallback):
    """Each prompt's measured pass rate every ``every`` steps (the sampler's records), for the plot."""

    def __init__(self, every: int) -> None:
        self.every, self.trainer, self.history = every, None, []

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every == 0 and self.trainer is not None:
            self.history.append((state.global_step, self.trainer.prompt_sampler.prompts.pass_rates()))


def held_out_pass_rates(model, tok, samples: int = 16) -> dict[int, float]:
    """Sampled pass rate per count on every (digit, count) prompt."""
    model.eval()
    rates = {}
    for k in (1, 2, 3):
        prompts = [f"{d}+{k}=" for d in range(10)]
        ids = tok(prompts, return_tensors="pt")["input_ids"].repeat_interleave(samples, 0)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=k,
                                 pad_token_id=0)
        texts = tok.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)
        rates[k] = float(np.mean([t.startswith(p[0] * k) for t, p in zip(texts, np.repeat(prompts, samples))]))
    return rates


def run(arm: str, steps: int, seed: int, plot_every: int):
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(VOCAB), n_positions=16, n_embd=32, n_layer=2, n_head=2,
                                       bos_token_id=1, eos_token_id=1, pad_token_id=0))
    data, tok = task(copies=4), tokenizer()
    args = GRPOConfig(tempfile.mkdtemp(), per_device_train_batch_size=PROMPTS_PER_BATCH * GENERATIONS,
                      num_generations=GENERATIONS, max_completion_length=4, max_steps=steps, learning_rate=3e-3,
                      use_cpu=True, report_to="none", save_strategy="no", logging_steps=10, disable_tqdm=True,
                      log_level="error", seed=seed)
    common = dict(model=model, reward_funcs=exact_start, args=args, train_dataset=data, processing_class=tok)
    if arm == "uniform":
        trainer = GRPOTrainer(**common)
    else:  # the difficulty is each prompt's label: its estimate shrinks toward its difficulty's running mean
        sampler = PromptSampler(len(data), PROMPTS_PER_BATCH, group_size=GENERATIONS, labels=np.array(data["count"]),
                                retest_every=10, seed=seed)
        trainer = PrioritizedGRPOTrainer(**common, prompt_sampler=sampler)
    rates = PassRates(plot_every)
    rates.trainer = trainer if arm != "uniform" else None
    trainer.add_callback(rates)
    trainer.remove_callback(PrinterCallback)  # the logs stay in trainer.state.log_history
    trainer.train()
    zero = [h["frac_reward_zero_std"] for h in trainer.state.log_history if "frac_reward_zero_std" in h]
    return float(np.mean(zero)), held_out_pass_rates(model, tok), rates.history, np.array(data["count"])


def plot(history, counts, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [step for step, _ in history]
    table = np.array([rates for _, rates in history])  # (marks, prompts), NaN until measured
    fig, ax = plt.subplots(figsize=(7, 4))
    for k, color in zip((1, 2, 3), ("tab:green", "tab:orange", "tab:red")):
        for i in np.flatnonzero(counts == k):
            ax.plot(steps, table[:, i], color=color, alpha=0.25, lw=0.8)
        ax.plot([], [], color=color, label=f"count {k}")
    ax.set(xlabel="step", ylabel="measured pass rate", title="each prompt's pass rate (the sampler's record)")
    ax.legend()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arms", nargs="+", default=["uniform", "learnability"], choices=["uniform", "learnability"])
    parser.add_argument("--plot", help="write each prompt's pass rate over training here (needs matplotlib)")
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = {}
    for arm in options.arms:
        zero, held_out, history, counts = run(arm, options.steps, options.seed, max(1, options.steps // 30))
        results[arm] = zero, held_out
        print(f"{arm:>12}: zero-variance groups {zero:.2f}; held-out pass rate by count "
              + ", ".join(f"{k}: {rate:.2f}" for k, rate in held_out.items()))
        if options.plot and history:
            plot(history, counts, options.plot)
    return results


if __name__ == "__main__":
    main()
