"""MixingTrainer: a tiny BERT (built from a config, nothing downloaded) trains on mixture batches, feeds each
source's loss back, writes the sampler into its checkpoints and resumes the identical stream from one."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from replayloader.distributed import load_shared_state  # noqa: E402
from replayloader.mixing import ODM, MixtureSampler  # noqa: E402
from replayloader.torch.mixing_trainer import STATE_FILE, MixingTrainer, causal_lm_per_example_loss  # noqa: E402

N, BATCH = 48, 8


def examples(n=N, seed=0):
    """Three sources of 16: labels follow the tokens in sources 0 and 1, are random in source 2."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 20, (n, 8), generator=g)
    labels = (ids[:, 1:].float().mean(1) > 11).long()
    labels[32:] = torch.randint(0, 2, (n - 32,), generator=g)
    return [{"input_ids": ids[i], "attention_mask": torch.ones(8, dtype=torch.long), "labels": labels[i]}
            for i in range(n)]


def make_trainer(out, seen, **args):
    config = transformers.BertConfig(vocab_size=20, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, num_labels=2,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)
    sampler = MixtureSampler.from_labels(np.repeat([0, 1, 2], 16), batch_size=BATCH, rule=ODM(warmup_steps=0),
                                         seed=0, names=["easy", "also easy", "noise"])
    options = {"output_dir": str(out), "max_steps": 10, "learning_rate": 1e-2, "save_strategy": "steps",
               "save_steps": 4, "report_to": [], "use_cpu": True, "disable_tqdm": True, "logging_strategy": "no",
               "seed": 0, **args}

    class Observed(MixingTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if model.training:
                seen.append(inputs["index"].tolist())
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    data = examples()
    return Observed(model=model, args=transformers.TrainingArguments(**options), train_dataset=data,
                    eval_dataset=data, sampler=sampler), sampler


def test_the_trainer_trains_on_mixture_batches_checkpoints_the_sampler_and_resumes_its_stream(tmp_path):
    seen: list = []
    trainer, sampler = make_trainer(tmp_path / "full", seen)
    result = trainer.train()
    assert np.isfinite(result.training_loss) and trainer.state.global_step == 10
    assert len(seen) == 10 and sampler.stats()["feedback_calls"] == 10
    assert not np.allclose(sampler.probabilities(), 1 / 3)  # the losses moved the mixture
    for step in seen:
        assert len(step) == BATCH and max(step) < N
    assert np.isfinite(trainer.evaluate()["eval_loss"])  # evaluation does not touch the sampler
    assert sampler.stats()["feedback_calls"] == 10
    for step in (4, 8):
        saved = load_shared_state(tmp_path / "full" / f"checkpoint-{step}" / STATE_FILE)
        assert saved["mixture"]["feedback_calls"] == step
        assert len(saved["pending"]) == 1  # Accelerate's loader had fetched the next batch: it is replayed

    resumed_seen: list = []
    resumed, resumed_sampler = make_trainer(tmp_path / "full", resumed_seen)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-4"))
    assert resumed_seen == seen[4:]  # the identical batches, the replayed one first
    np.testing.assert_allclose(resumed_sampler.probabilities(), sampler.probabilities(), rtol=1e-6)


def test_resuming_from_a_checkpoint_without_the_sampler_file_is_an_error(tmp_path):
    seen: list = []
    trainer, _ = make_trainer(tmp_path, seen, max_steps=4)
    trainer.train()
    (tmp_path / "checkpoint-4" / STATE_FILE).unlink()
    again, _ = make_trainer(tmp_path, seen)
    with pytest.raises(FileNotFoundError, match="not written by a MixingTrainer"):
        again.train(resume_from_checkpoint=True)


def test_the_trainer_refuses_a_sampler_of_another_size(tmp_path):
    trainer_args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=20, hidden_size=8, num_hidden_layers=1, num_attention_heads=1, intermediate_size=8,
        max_position_embeddings=16))
    sampler = MixtureSampler([10, 10], batch_size=4, rule=ODM())
    with pytest.raises(ValueError, match="covers 20 examples but train_dataset has 48"):
        MixingTrainer(model=model, args=trainer_args, train_dataset=examples(), sampler=sampler)


def test_causal_lm_per_example_loss_is_the_models_own_loss_per_example():
    config = transformers.GPT2Config(vocab_size=30, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=0,
                                     eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()  # no dropout: the two passes must agree
    ids = torch.randint(0, 30, (3, 10))
    labels = ids.clone()
    labels[1, 6:] = -100  # padding is not counted
    outputs = model(input_ids=ids, labels=labels)
    per_example = causal_lm_per_example_loss(outputs, labels)
    for i in range(3):
        own = model(input_ids=ids[i:i + 1], labels=labels[i:i + 1]).loss
        torch.testing.assert_close(per_example[i], own, rtol=1e-5, atol=1e-6)
