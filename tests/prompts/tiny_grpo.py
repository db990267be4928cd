"""A GRPO run small enough for a test: a 2-layer GPT-2 built from a config, a 14-symbol character tokenizer made
offline, addition prompts of equal length (TRL left-pads, and GPT-2 here counts positions from the first token),
and a reward that depends only on (prompt, step, place in its group), so a prompt stream can be compared between
runs whatever the model generates."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from datasets import Dataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
from trl import GRPOConfig

@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread for a test's tiny GRPO run (as the study's runs), the previous count restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


VOCAB = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate("0123456789+=")}}


def tokenizer() -> PreTrainedTokenizerFast:
    raw = Tokenizer(models.WordLevel(VOCAB, unk_token="<pad>"))
    raw.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    raw.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", eos_token="<eos>")


def model(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(vocab_size=len(VOCAB), n_positions=16, n_embd=16, n_layer=2, n_head=2,
                                      bos_token_id=1, eos_token_id=1, pad_token_id=0))


def prompts(n: int = 40) -> Dataset:
    return Dataset.from_dict({"prompt": [f"{i % 10}+{i // 10 % 10}=" for i in range(n)]})


def config(out, **options) -> GRPOConfig:
    settings = dict(per_device_train_batch_size=8, num_generations=4, max_completion_length=3, max_steps=4,
                    use_cpu=True, report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
                    learning_rate=1e-4, seed=0)
    return GRPOConfig(str(out), **{**settings, **options})


class StreamReward:
    """A reward function recording each call's ``prompt_index`` list; its reward is a fixed function of (prompt,
    trainer step, place in the group), in {0, 1}. ``offset``: this process's first completion in the generation
    batch (under several processes)."""

    __name__ = "stream_reward"

    def __init__(self, group: int, offset: int = 0) -> None:
        self.group, self.offset, self.calls, self.completions = group, offset, [], []

    def __call__(self, completions, prompt_index, trainer_state, **kwargs):
        self.calls.append([int(i) for i in prompt_index])
        self.completions.append(list(completions))  # not rewarded: a resume check of the sampling RNG
        places = (np.arange(len(completions)) + self.offset) % self.group
        codes = np.asarray(prompt_index) * 31 + trainer_state.global_step * 17 + places * 7
        return ((codes % 5) < 2).astype(float).tolist()


class CompletionReward:
    """A reward function that depends on what the model generated (0/1: whether the completion's character codes
    sum to an even number), recording each call's ``prompt_index`` list and completions: a resumed run matches the
    uninterrupted one only if it generates the same completions, so only if the sampling RNG resumes exactly."""

    __name__ = "completion_reward"

    def __init__(self) -> None:
        self.calls, self.completions = [], []

    def __call__(self, completions, prompt_index, **kwargs):
        self.calls.append([int(i) for i in prompt_index])
        self.completions.append(list(completions))
        return [float(sum(map(ord, c)) % 2 == 0) for c in completions]
