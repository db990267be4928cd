"""Issue 39's task: ``a+b=`` addition with a difficulty knob, for GRPO through TRL on this CPU.

    python -m experiments.grpo_task warmup                # the shared warm-started model -> runs/grpo/warmup/
    python -m experiments.grpo_task eval runs/grpo/warmup # held-out accuracy (greedy), pass rates (sampled)
    python -m experiments.grpo_task show                  # a few prompts of each difficulty, the sets' sizes

Everything here is generated offline from fixed seeds (no hub, no data files):

- **Problems.** Difficulty d = digits per operand, 1-5: for d = 1 both operands lie in 0-9, for d >= 2 in
  [10^(d-1), 10^d - 1]. The prompt writes both operands zero-padded to 5 digits, ``00042+00917=``, so every
  prompt is 12 tokens long: TRL left-pads prompts and GPT-2's forward in transformers 5.24 computes positions as a
  plain range, so prompts of equal length keep every position right. The answer is the sum zero-padded to 6
  digits, ``000959``, then the end-of-sequence token; reward 1 for an exact answer, else 0. (A first warm-up
  with unpadded answers, ``959``, learnt too slowly here: after 1,500 steps held-out greedy accuracy was
  .63 / .05 / .01 / 0 / 0 for d = 1..5; zero-padded answers align every output digit with its operands.)
- **Held-out set.** 300 distinct problems for each d >= 2 (seed ``HELDOUT_SEED``). d = 1 has only 100 distinct
  problems: its held-out set is all of them, so it overlaps every training set (it is reported, but no endpoint
  uses it).
- **Training pool.** 4,000 prompts per difficulty (20,000), seed ``POOL_SEED``, none of them a held-out problem
  (d >= 2; the pool's d = 1 rows repeat the 100 problems). Rows are ordered d = 1..5 blocks; ``difficulty``
  is a column.
- **Tokenizer.** One token per character (``0-9 + =``) plus ``<pad>`` and ``<eos>``, built with ``tokenizers``
  and wrapped in ``PreTrainedTokenizerFast``.
- **Model.** GPT-2 from a config: 3 layers, width 96, 4 heads, 32 positions (about 0.34M parameters).
- **Warm-up.** Supervised next-token training on the answer tokens (prompt tokens masked), batches of 64 with
  difficulty weights per stage (``WARMUP_STAGES``), AdamW, linear warm-up then cosine, fixed seeds; problems drawn
  fresh each batch, never a held-out one. Stage 1 (1,000 steps, lr 2e-3, weights toward the middle) left a model
  whose completions at temperature 1 were nearly all partly right (sampled pass rates .78 / .62 / .47 / .38 / .18,
  only 2-31% zero-variance groups per difficulty), the wrong regime for issue 39; stage 2 (1,500 steps, lr 1e-3,
  weights on d = 1..4, none on d = 5) makes it confident. Saved once to ``runs/grpo/warmup/`` (each stage under
  ``stage<k>``) with its held-out accuracy and recipe (``warmup.json``); every arm and seed of the study starts
  from that one model.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
WARMUP_DIR = REPO / "runs" / "grpo" / "warmup"

DIFFICULTIES = (1, 2, 3, 4, 5)
WIDTH = 5  # operand digits in the prompt (zero-padded)
PROMPT_LEN = 2 * WIDTH + 2  # "ddddd+ddddd="
MAX_ANSWER = WIDTH + 1  # digits of the largest sum
MAX_COMPLETION = MAX_ANSWER + 1  # the answer and <eos>
HELDOUT_SEED = 39_000
POOL_SEED = 39_001
HELDOUT_PER_DIFFICULTY = 300
POOL_PER_DIFFICULTY = 4000
CHARS = "0123456789+="
VOCAB = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(CHARS)}}
MODEL = dict(n_layer=3, n_embd=96, n_head=4, n_positions=32)
_STAGE = dict(batch_size=64, warmup_steps=100, weight_decay=0.01, eval_every=250)
WARMUP_STAGES = (  # difficulty weights for d = 1..5
    dict(_STAGE, steps=1000, lr=2e-3, weights=[0.05, 0.15, 0.35, 0.3, 0.15], seed=0),
    dict(_STAGE, steps=1500, lr=1e-3, weights=[0.15, 0.35, 0.35, 0.15, 0.0], seed=1),
)


# ------------------------------------------------------------------------------------------------ problems
def operand_range(d: int) -> tuple[int, int]:
    """Inclusive range of a d-digit operand (d = 1 includes 0)."""
    return (0, 9) if d == 1 else (10 ** (d - 1), 10 ** d - 1)


def prompt_text(a: int, b: int) -> str:
    return f"{a:0{WIDTH}d}+{b:0{WIDTH}d}="


def answer_text(a: int, b: int) -> str:
    """The sum, zero-padded to MAX_ANSWER digits (every answer is MAX_ANSWER tokens and <eos>)."""
    return f"{int(a) + int(b):0{MAX_ANSWER}d}"


def draw_pairs(rng: np.random.Generator, d: int, n: int) -> np.ndarray:
    lo, hi = operand_range(d)
    return rng.integers(lo, hi + 1, size=(n, 2))


def heldout_pairs() -> dict[int, np.ndarray]:
    """Per difficulty, the held-out (a, b) pairs: all 100 for d = 1, 300 distinct for d >= 2."""
    rng = np.random.default_rng(HELDOUT_SEED)
    out = {1: np.array([(a, b) for a in range(10) for b in range(10)])}
    for d in DIFFICULTIES[1:]:
        seen: set[tuple[int, int]] = set()
        rows = []
        while len(rows) < HELDOUT_PER_DIFFICULTY:
            a, b = (int(x) for x in draw_pairs(rng, d, 1)[0])
            if (a, b) not in seen:
                seen.add((a, b))
                rows.append((a, b))
        out[d] = np.array(rows)
    return out


def _heldout_keys() -> set[tuple[int, int]]:
    return {(int(a), int(b)) for d, pairs in heldout_pairs().items() if d >= 2 for a, b in pairs}


def pool_pairs(per_difficulty: int = POOL_PER_DIFFICULTY, seed: int = POOL_SEED) -> tuple[np.ndarray, np.ndarray]:
    """The training pool: (pairs (N, 2), difficulty (N,)), d = 1..5 blocks, no held-out problem for d >= 2."""
    rng = np.random.default_rng(seed)
    banned = _heldout_keys()
    pairs, diff = [], []
    for d in DIFFICULTIES:
        got = 0
        while got < per_difficulty:
            for a, b in draw_pairs(rng, d, per_difficulty - got):
                if (int(a), int(b)) in banned:
                    continue
                pairs.append((int(a), int(b)))
                diff.append(d)
                got += 1
    return np.array(pairs, dtype=np.int64), np.array(diff, dtype=np.int64)


def rows(pairs: np.ndarray, difficulty: np.ndarray) -> dict[str, list]:
    """Dataset columns: prompt, answer, difficulty."""
    return {"prompt": [prompt_text(a, b) for a, b in pairs],
            "answer": [answer_text(a, b) for a, b in pairs],
            "difficulty": [int(d) for d in difficulty]}


def pool_dataset(per_difficulty: int = POOL_PER_DIFFICULTY):
    from datasets import Dataset

    pairs, diff = pool_pairs(per_difficulty)
    return Dataset.from_dict(rows(pairs, diff))


def heldout_rows() -> dict[str, list]:
    held = heldout_pairs()
    pairs = np.concatenate([held[d] for d in DIFFICULTIES])
    diff = np.concatenate([np.full(len(held[d]), d) for d in DIFFICULTIES])
    return rows(pairs, diff)


# ------------------------------------------------------------------------------------------------ reward
def exact_answer(completions, answer, **kwargs) -> list[float]:
    """TRL reward function: 1.0 when the completion (up to <eos>) is exactly the sum, else 0.0."""
    return [float(c.replace(" ", "").strip() == a) for c, a in zip(completions, answer)]


# ------------------------------------------------------------------------------------------------ model
def make_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel(VOCAB, unk_token="<pad>"))
    raw.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    raw.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", eos_token="<eos>")
    tok.padding_side = "left"
    return tok


def make_model(seed: int):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(VOCAB), bos_token_id=VOCAB["<eos>"], eos_token_id=VOCAB["<eos>"],
                        pad_token_id=VOCAB["<pad>"], **MODEL)
    return GPT2LMHeadModel(config)


def encode_prompts(prompts: list[str]):
    """(n, PROMPT_LEN) token ids; every prompt has the same length, so there is no padding."""
    import torch

    ids = [[VOCAB[c] for c in p] for p in prompts]
    assert all(len(x) == PROMPT_LEN for x in ids)
    return torch.tensor(ids, dtype=torch.long)


def greedy_answers(model, prompts: list[str], batch_size: int = 500) -> list[str]:
    """Greedy completions (up to <eos> or MAX_COMPLETION tokens), as text."""
    import torch

    inv = {i: c for c, i in VOCAB.items()}
    was_training = model.training
    model.eval()
    out: list[str] = []
    with torch.no_grad():
        for start in range(0, len(prompts), batch_size):
            ids = encode_prompts(prompts[start:start + batch_size])
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_COMPLETION,
                                 do_sample=False, pad_token_id=VOCAB["<pad>"], eos_token_id=VOCAB["<eos>"])
            for row in gen[:, PROMPT_LEN:].tolist():
                text = []
                for t in row:
                    if t in (VOCAB["<eos>"], VOCAB["<pad>"]):
                        break
                    text.append(inv[t])
                out.append("".join(text))
    if was_training:
        model.train()
    return out


def evaluate(model, held: dict[str, list] | None = None) -> dict[str, float]:
    """Greedy exact-answer accuracy per difficulty (``acc_d1`` .. ``acc_d5``) and the mean over d = 2..5
    (``acc_2_5``) and d = 2..4 (``acc_2_4``) on the held-out set."""
    held = held or heldout_rows()
    got = greedy_answers(model, held["prompt"])
    right = np.array([g == a for g, a in zip(got, held["answer"])])
    diff = np.array(held["difficulty"])
    res = {f"acc_d{d}": float(right[diff == d].mean()) for d in DIFFICULTIES}
    res["acc_2_5"] = float(np.mean([res[f"acc_d{d}"] for d in (2, 3, 4, 5)]))
    res["acc_2_4"] = float(np.mean([res[f"acc_d{d}"] for d in (2, 3, 4)]))
    return res


def sampled_pass_rates(model, per_difficulty: int = 64, group: int = 8, temperature: float = 1.0,
                       seed: int = 0) -> dict[str, float]:
    """On the first ``per_difficulty`` held-out prompts of each difficulty, ``group`` completions each sampled at
    ``temperature`` (as GRPO samples them): the mean pass rate ``p_d<d>`` and the share of groups with zero reward
    variance ``zero_d<d>`` (all solved or all failed), and ``zero_all`` over every difficulty (d = 1..5 equally,
    as the pool holds them)."""
    import torch

    torch.manual_seed(seed)
    held = heldout_rows()
    diff = np.array(held["difficulty"])
    was_training = model.training
    model.eval()
    res: dict[str, float] = {}
    zeros = []
    for d in DIFFICULTIES:
        idx = np.flatnonzero(diff == d)[:per_difficulty]
        ids = encode_prompts([held["prompt"][i] for i in idx]).repeat_interleave(group, 0)
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_COMPLETION,
                                 do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                                 pad_token_id=VOCAB["<pad>"], eos_token_id=VOCAB["<eos>"])
        want = np.array([[VOCAB[c] for c in held["answer"][i]] + [VOCAB["<eos>"]] for i in idx])
        got = gen[:, PROMPT_LEN:PROMPT_LEN + MAX_COMPLETION].numpy()
        ok = (got.shape[1] == MAX_COMPLETION) & (got == np.repeat(want, group, 0)).all(1)
        k = ok.reshape(-1, group).sum(1)
        zero = (k == 0) | (k == group)
        res[f"p_d{d}"] = float(ok.mean())
        res[f"zero_d{d}"] = float(zero.mean())
        zeros.append(zero.mean())
    res["zero_all"] = float(np.mean(zeros))
    if was_training:
        model.train()
    return res


# ------------------------------------------------------------------------------------------------ warm-up
def _warmup_batch(rng: np.random.Generator, batch_size: int, banned: set[tuple[int, int]], weights: np.ndarray):
    """Token ids and labels (answer + <eos> only) of one warm-up batch, difficulty drawn by ``weights``."""
    import torch

    length = PROMPT_LEN + MAX_COMPLETION
    ids = np.full((batch_size, length), VOCAB["<pad>"], dtype=np.int64)
    labels = np.full((batch_size, length), -100, dtype=np.int64)
    ds = rng.choice(DIFFICULTIES, size=batch_size, p=weights)
    for i, d in enumerate(ds):
        while True:
            a, b = (int(x) for x in draw_pairs(rng, int(d), 1)[0])
            if d == 1 or (a, b) not in banned:
                break
        seq = [VOCAB[c] for c in prompt_text(a, b) + answer_text(a, b)] + [VOCAB["<eos>"]]
        ids[i, :len(seq)] = seq
        labels[i, PROMPT_LEN:len(seq)] = seq[PROMPT_LEN:]
    return torch.from_numpy(ids), torch.from_numpy(labels)


def _train_stage(model, stage: dict, log=print) -> list[dict]:
    """One supervised stage on ``model`` (in place): AdamW, linear warm-up then cosine to 10% of ``lr``."""
    import torch

    rng = np.random.default_rng(stage["seed"])
    banned = _heldout_keys()
    held = heldout_rows()
    weights = np.asarray(stage["weights"], dtype=float)
    opt = torch.optim.AdamW(model.parameters(), lr=stage["lr"], weight_decay=stage["weight_decay"],
                            betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / stage["warmup_steps"])
        * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / stage["steps"])))))
    history = []
    t0 = time.perf_counter()
    model.train()
    for step in range(1, stage["steps"] + 1):
        ids, labels = _warmup_batch(rng, stage["batch_size"], banned, weights / weights.sum())
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % stage["eval_every"] == 0 or step == stage["steps"]:
            acc = evaluate(model, held)
            row = {"step": step, "loss": float(loss), "seconds": round(time.perf_counter() - t0, 1), **acc}
            history.append(row)
            log(json.dumps(row))
    return history


def warmup(out: Path = WARMUP_DIR, log=print) -> dict:
    """Train the shared warm-started model, stage by stage (``WARMUP_STAGES``), and save it (model, tokenizer,
    warmup.json) under ``out``. Each stage is saved under ``out/stage<k>`` and reused when its recipe matches, so
    an interrupted warm-up resumes at a stage boundary."""
    import torch
    from transformers import GPT2LMHeadModel

    torch.set_num_threads(1)
    model = make_model(WARMUP_STAGES[0]["seed"])
    stages = []
    for k, stage in enumerate(WARMUP_STAGES, start=1):
        folder = out / f"stage{k}"
        done = folder / "warmup.json"
        if done.is_file() and json.loads(done.read_text()).get("stage") == json.loads(json.dumps(stage)):
            model = GPT2LMHeadModel.from_pretrained(folder)
            info = json.loads(done.read_text())
            log(f"stage {k}: reused {folder}")
        else:
            history = _train_stage(model, stage, log)
            folder.mkdir(parents=True, exist_ok=True)
            model.save_pretrained(folder)
            info = {"stage": stage, "history": history}
            done.write_text(json.dumps(info, indent=1))
        stages.append(info)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    make_tokenizer().save_pretrained(out)
    info = {"stages": stages, "model": MODEL, "parameters": sum(p.numel() for p in model.parameters()),
            "heldout": stages[-1]["history"][-1]}
    (out / "warmup.json").write_text(json.dumps(info, indent=1))
    return info


def load_warm(path: Path = WARMUP_DIR):
    """(model, tokenizer) of the saved warm-up."""
    from transformers import GPT2LMHeadModel

    if not (Path(path) / "warmup.json").is_file():
        raise FileNotFoundError(f"{path} has no warm-up: run python -m experiments.grpo_task warmup")
    return GPT2LMHeadModel.from_pretrained(path), make_tokenizer()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("warmup")
    w.add_argument("--out", type=Path, default=WARMUP_DIR)
    e = sub.add_parser("eval", help="greedy held-out accuracy and sampled pass rates (temperature 1, groups of 8)")
    e.add_argument("path", type=Path, nargs="?", default=WARMUP_DIR)
    sub.add_parser("show")
    a = p.parse_args(argv)
    if a.cmd == "warmup":
        info = warmup(a.out)
        print(f"saved {a.out} ({info['parameters']} parameters)")
    elif a.cmd == "eval":
        import torch

        torch.set_num_threads(1)
        model, _ = load_warm(a.path)
        print(json.dumps(evaluate(model)))
        print(json.dumps({k: round(v, 3) for k, v in sampled_pass_rates(model).items()}))
    else:
        held = heldout_rows()
        pool = pool_pairs()
        print(f"held-out: {len(held['prompt'])} problems; pool: {len(pool[0])} prompts")
        for d in DIFFICULTIES:
            i = held["difficulty"].index(d)
            print(d, held["prompt"][i], held["answer"][i])


if __name__ == "__main__":
    main()
