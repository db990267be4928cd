"""PrioritizedBatchSampler in a torch DataLoader (workers, pin_memory, batch info, resume) and the Trainer recipe."""
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from replayloader.sampler import LinearSchedule, PrioritizedSampler
from replayloader.torch.batch_sampler import PrioritizedBatchSampler


class IndexDataset(Dataset):
    """Example i is its own index, so a batch shows which indices the workers were sent."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        return {"index": torch.tensor(i), "x": torch.full((3,), float(i))}


def make_sampler(seed=0):
    return PrioritizedSampler(40, 6, alpha=0.8, beta=LinearSchedule(0.5, 1.0, 10), uniform_fraction=0.1, seed=seed)


def loader_for(batch_sampler, workers):
    return DataLoader(IndexDataset(), batch_sampler=batch_sampler, num_workers=workers, pin_memory=True,
                      **({"prefetch_factor": 2} if workers else {}))


def train(batch_sampler, loader, epochs, stop_after=None, done=0):
    """Receive batches, check their info, feed back a loss; returns the index lists received (and stops after
    `stop_after` batches, as a job killed at a checkpoint would; `done` batches were received before)."""
    seen = []
    for _ in range(epochs):
        for batch in loader:
            info = batch_sampler.next_batch_info()
            np.testing.assert_array_equal(batch["index"].numpy(), info.indices)  # the info is this batch's
            weights = batch_sampler.importance_weights(info, batch["x"])
            assert weights.dtype == batch["x"].dtype and weights.shape == (len(info),)
            batch_sampler.feedback(info, loss=(batch["index"] % 7).float() + 0.1 * (done + len(seen)))
            seen.append(info.indices.tolist())
            if stop_after is not None and len(seen) == stop_after:
                return seen
    return seen


def test_without_feedback_two_workers_and_pin_memory_give_the_same_index_stream_as_no_workers():
    streams = {}
    for workers in (0, 2):
        batch_sampler = PrioritizedBatchSampler(make_sampler())
        streams[workers] = [b["index"].tolist() for _ in range(3) for b in loader_for(batch_sampler, workers)]
    assert len(streams[0]) == 3 * 7 and streams[0] == streams[2]


def test_with_feedback_workers_draw_ahead_and_the_stream_differs_from_the_second_prioritized_batch():
    """What docs/sampler.md states: a batch is drawn num_workers x prefetch_factor batches before the loop receives
    it (within one iter()), so with feedback the warm-up pass and the first batch of the next iter() are the
    same for 0 and 2 workers, and the second differs once the first one's feedback changed the weights."""
    streams = {}
    for workers in (0, 2):
        batch_sampler = PrioritizedBatchSampler(make_sampler())
        loader, seen = loader_for(batch_sampler, workers), []
        for _ in range(2):  # the warm-up pass, then the first prioritized epoch
            for j, batch in enumerate(loader):
                info = batch_sampler.next_batch_info()
                ahead = batch_sampler.sampler.step - info.step - 1  # drawn after this batch, before its feedback
                assert ahead == min(2 * workers, len(batch_sampler) - j - 1)
                first_prioritized = info.epoch == 1 and j == 0
                batch_sampler.feedback(info, loss=np.full(len(info), 1000.0 if first_prioritized else 1.0))
                seen.append(info.indices.tolist())
        streams[workers] = seen
    warmup = len(batch_sampler)
    assert streams[0][: warmup + 1] == streams[2][: warmup + 1]
    assert streams[0][warmup + 1] != streams[2][warmup + 1]
    # without workers, the second batch was drawn after the first one's feedback: mostly its examples again
    assert len(set(streams[0][warmup + 1]) & set(streams[0][warmup])) >= 3


@pytest.mark.parametrize("workers", [0, 2])
def test_feedback_through_a_dataloader_reaches_the_sampler(workers):
    batch_sampler = PrioritizedBatchSampler(make_sampler())
    seen = train(batch_sampler, loader_for(batch_sampler, workers), epochs=2)
    assert len(seen) == 2 * len(batch_sampler)
    assert batch_sampler.sampler.counters["updated"] > 0 and batch_sampler.sampler.epoch == 2
    with pytest.raises(RuntimeError, match="no batch is waiting"):
        batch_sampler.next_batch_info()


@pytest.mark.parametrize("stop", [4, 7, 10])  # mid warm-up, at the warm-up's end, mid prioritized epoch
def test_resume_through_a_two_worker_dataloader_continues_identically(stop):
    whole_sampler = PrioritizedBatchSampler(make_sampler())
    whole = train(whole_sampler, loader_for(whole_sampler, 2), epochs=3)
    first = PrioritizedBatchSampler(make_sampler())
    head = train(first, loader_for(first, 2), epochs=3, stop_after=stop)
    state = first.state_dict()
    resumed = PrioritizedBatchSampler(make_sampler())
    resumed.load_state_dict(state)
    epochs_left = 3 - stop // len(resumed)  # an interrupted epoch counts as one
    tail = train(resumed, loader_for(resumed, 2), epochs=epochs_left, done=stop)
    assert head + tail[: len(whole) - stop] == whole


def test_a_state_saved_again_before_the_loaded_batches_are_yielded_still_holds_them():
    """The batches a checkpoint carried are pending until the loop receives them, also when the loaded sampler
    is checkpointed again before it iterates (a job stopped right after a resume)."""
    whole_sampler = PrioritizedBatchSampler(make_sampler())
    whole = train(whole_sampler, loader_for(whole_sampler, 2), epochs=2)
    first = PrioritizedBatchSampler(make_sampler())
    head = train(first, loader_for(first, 2), epochs=2, stop_after=3)
    assert first.state_dict()["pending"]  # the two workers fetched ahead
    again = PrioritizedBatchSampler(make_sampler())
    again.load_state_dict(first.state_dict())
    resumed = PrioritizedBatchSampler(make_sampler())
    resumed.load_state_dict(again.state_dict())
    tail = train(resumed, loader_for(resumed, 2), epochs=2, done=3)
    assert head + tail[: len(whole) - 3] == whole


class TokenDataset(Dataset):
    """A learnable toy task: the label says whether token 3 occurs in the sequence."""

    def __init__(self, n=24, length=8, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(4, 20, (n, length), generator=g)
        self.ids[: n // 2, 2] = 3
        self.labels = (self.ids == 3).any(1).long()

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.labels[i]}


def test_trainer_recipe_trains_on_prioritized_batches_and_feeds_the_loss_back(tmp_path):
    transformers = pytest.importorskip("transformers")
    from replayloader.torch.hf import PrioritizedTrainer

    config = transformers.BertConfig(vocab_size=20, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, num_labels=2)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)
    dataset = TokenDataset()
    sampler = PrioritizedSampler(len(dataset), 4, beta=0.5, uniform_fraction=0.1, seed=0)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=10, learning_rate=1e-3,
                                          logging_steps=5, save_strategy="no", report_to=[], use_cpu=True,
                                          dataloader_num_workers=0, disable_tqdm=True)
    trainer = PrioritizedTrainer(model=model, args=args, train_dataset=dataset, eval_dataset=dataset,
                                 sampler=sampler)
    before = sampler.weights.copy()
    result = trainer.train()
    assert np.isfinite(result.training_loss)
    # 10 steps: the 6 warm-up batches and 4 prioritized ones (accelerate's loader may draw one ahead)
    assert sampler.step - len(trainer.batch_sampler._handed_out) == 10 and sampler.epoch == 1
    assert sampler.stats()["frac_never_visited"] == 0.0  # every warm-up batch was fed back
    assert sampler.visits.sum() > len(dataset)
    assert not np.array_equal(sampler.weights, before)  # fed back: weights are the per-example losses
    visits = sampler.visits.sum()
    assert np.isfinite(trainer.evaluate()["eval_loss"])  # evaluation does not touch the sampler
    assert sampler.visits.sum() == visits


def test_trainer_recipe_drops_unused_columns_of_a_datasets_dataset(tmp_path):
    transformers = pytest.importorskip("transformers")
    datasets = pytest.importorskip("datasets")
    from replayloader.torch.hf import PrioritizedTrainer

    toy = TokenDataset(n=8)
    dataset = datasets.Dataset.from_dict({"input_ids": toy.ids.tolist(), "labels": toy.labels.tolist(),
                                          "sentence": ["text"] * 8})  # a column the model does not take
    config = transformers.BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                                     intermediate_size=8, max_position_embeddings=16, num_labels=2)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=3, save_strategy="no", report_to=[],
                                          use_cpu=True, disable_tqdm=True)
    sampler = PrioritizedSampler(8, 4, seed=0)

    def collate(features):
        assert set(features[0]) == {"input_ids", "labels"}  # "sentence" was dropped, as the Trainer's loader does
        return transformers.default_data_collator(features)

    trainer = PrioritizedTrainer(model=transformers.BertForSequenceClassification(config), args=args,
                                 train_dataset=dataset, sampler=sampler, data_collator=collate)
    assert np.isfinite(trainer.train().training_loss)
    assert sampler.visits.sum() >= 8  # the warm-up pass was fed back


def test_the_batch_sampler_takes_the_sampler_family_not_a_list():
    """`SamplerLike` is checked structurally: both samplers qualify, and anything else is refused by name."""
    from replayloader.distributed import DistributedPrioritizedSampler
    from replayloader.sampler import SamplerLike

    assert isinstance(PrioritizedSampler(10, batch_size=2, seed=0), SamplerLike)
    assert all(hasattr(DistributedPrioritizedSampler, name) for name in
               ("next_batch", "feedback", "settle", "state_dict", "load_state_dict", "__iter__", "__len__"))
    with pytest.raises(TypeError, match="sampler must be a PrioritizedSampler or a DistributedPrioritizedSampler "
                                        r"\(a SamplerLike.*got list"):
        PrioritizedBatchSampler([1, 2, 3])


def test_resume_where_the_prefetched_batch_closed_the_epoch_accepts_the_loops_epoch():
    """A checkpoint taken when the loop has received batch 2 of 3 while the DataLoader already drew batch 3
    (closing epoch 0: the sampler is in epoch 1). On resume the framework calls set_epoch(0), the loop's epoch:
    that must replay batch 3 and go on into epoch 1, not refuse to go back."""
    def fresh():
        return PrioritizedBatchSampler(PrioritizedSampler(24, 8, seed=0, warmup_epochs=1))

    batches = fresh()
    stream = iter(batches)
    received = [next(stream), next(stream)]
    ahead = next(stream)  # drawn ahead by the loader, not received by the loop
    for _ in received:
        batches.feedback(batches.next_batch_info(), loss=np.ones(8))
    assert batches.sampler.epoch == 1
    state = batches.state_dict()
    resumed = fresh()
    resumed.load_state_dict(state)
    resumed.set_epoch(0)
    replayed = list(resumed)
    assert replayed == [ahead]
    resumed.feedback(resumed.next_batch_info(), loss=np.ones(8))
    resumed.set_epoch(1)
    assert len(list(resumed)) == 3 and resumed.sampler.epoch == 2
    with pytest.raises(ValueError, match="cannot go back"):
        resumed.set_epoch(0)
