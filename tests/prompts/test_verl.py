"""VerlPromptSampler against verl's curriculum-sampler contract (verl 0.4–0.7; verl does not install beside this
environment, so its trainer loop is reproduced here from the contract, not imported): built as
``cls(data_source=..., data_config=...)`` from config lines, batched by torchdata's ``StatefulDataLoader``, fed by
``update(batch=...)`` with DataProto-shaped batches whose responses are shuffled (verl's balance_batch), resumed
from the loader's state_dict, and bad input named."""
from __future__ import annotations

import copy
import importlib
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from replayloader.prompts import VerlPromptSampler  # noqa: E402
from replayloader.state import InvalidState  # noqa: E402

N, B, ROLLOUTS = 80, 8, 4
PASS_RATE = np.array([0.9, 0.5, 0.2, 0.0, 1.0])[np.arange(N) % 5]


def config(**sampler) -> dict:
    """``config.data`` as verl's legacy data config holds it, with this sampler's config lines."""
    return {"train_batch_size": B, "gen_batch_size": None, "seed": 3, "dataloader_num_workers": 0,
            "sampler": {"class_path": "pkg://replayloader.prompts.verl", "class_name": "VerlPromptSampler",
                        **sampler}}


def create_sampler(data_config: dict, dataset) -> torch.utils.data.Sampler:
    """What verl's create_rl_sampler does with data.sampler.class_path / class_name."""
    path = data_config["sampler"]["class_path"]
    module = importlib.import_module(path.removeprefix("pkg://").replace("/", "."))
    sampler = getattr(module, data_config["sampler"]["class_name"])(data_source=dataset, data_config=data_config)
    assert isinstance(sampler, torch.utils.data.Sampler)
    assert data_config["dataloader_num_workers"] == 0
    return sampler


def loader(sampler, dataset):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    return stateful.StatefulDataLoader(dataset, batch_size=B, drop_last=True, sampler=sampler, num_workers=0)


def rollout(prompt_ids, rng, *, shuffle=True) -> SimpleNamespace:
    """A DataProto-shaped step: ROLLOUTS responses per prompt, a uid per prompt, the score on the last token,
    rows reordered as verl's balance_batch does."""
    index = np.repeat(np.asarray(prompt_ids), ROLLOUTS)
    uid = np.repeat([f"uid-{p}-{rng.integers(1 << 30)}" for p in prompt_ids], ROLLOUTS)
    scores = torch.zeros(len(index), 6)
    scores[:, -1] = torch.as_tensor((rng.random(len(index)) < PASS_RATE[index]).astype(np.float32))
    order = rng.permutation(len(index)) if shuffle else np.arange(len(index))
    return SimpleNamespace(batch={"token_level_scores": scores[order], "responses": torch.zeros(len(index), 6)},
                           non_tensor_batch={"index": index[order].astype(object), "uid": uid[order].astype(object),
                                             "data_source": np.array(["arith"] * len(index), object)[order]})


def fit(sampler, data, steps, rng, *, save_at=None, skip=()):
    """verl's fit loop: one dataloader batch a step, generate, train, (checkpoint), update."""
    drawn, saved = [], None
    batches = (batch for _ in range(steps) for batch in data)  # epoch after epoch
    for step in range(steps):
        prompt_ids = next(batches)["id"].tolist()
        drawn.append(prompt_ids)
        batch = rollout(prompt_ids, rng)
        if step == save_at:
            saved = copy.deepcopy(data.state_dict())  # verl checkpoints before the update
        if step not in skip:
            sampler.update(batch=batch)
    return drawn, saved


class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"id": i}


def test_built_from_config_lines_it_draws_distinct_prompts_and_learns_from_updates():
    dataset = Rows()
    sampler = create_sampler(config(retest_every=5, rule="learnability"), dataset)
    assert len(loader(sampler, dataset)) == N // B
    drawn, _ = fit(sampler, loader(sampler, dataset), 60, np.random.default_rng(0))
    assert all(len(set(step)) == B for step in drawn)
    stats = sampler.stats()
    assert stats["updates"] == 60 and stats["groups"] == 60 * B and stats["max_lag_seen"] == 0
    assert stats["epoch"] == 60 // (N // B) - 1 and stats["retests"] > 0  # epochs counted from 0
    late = np.concatenate(drawn[30:])
    assert np.isin(PASS_RATE[late], [0.5, 0.2, 0.9]).mean() > 0.75  # partly solved prompts are drawn more
    measured = ~np.isnan(sampler.prompts.pass_rates())
    assert np.abs(sampler.prompts.pass_rates()[measured] - PASS_RATE[measured]).mean() < 0.3


def test_prioritized_draws_waste_fewer_groups_than_uniform_ones():
    dataset = Rows()
    shares = {}
    for rule in ("uniform", "learnability"):
        sampler = create_sampler(config(rule=rule), dataset)
        fit(sampler, loader(sampler, dataset), 50, np.random.default_rng(1))
        shares[rule] = sampler.stats()["frac_zero_variance_total"]
    assert shares["learnability"] < shares["uniform"] - 0.1


def test_a_loader_checkpoint_resumes_the_position_records_and_generator():
    # verl saves before the step's update, so that update never comes: compare with a run that skips it
    dataset = Rows()
    sampler = create_sampler(config(exploration=0.2, max_lag=None), dataset)
    whole, _ = fit(sampler, loader(sampler, dataset), 40, np.random.default_rng(2), skip={12})
    first = create_sampler(config(exploration=0.2, max_lag=None), dataset)
    rng = np.random.default_rng(2)
    before, saved = fit(first, loader(first, dataset), 13, rng, save_at=12, skip={12})
    resumed = create_sampler(config(exploration=0.2, max_lag=None), dataset)
    data = loader(resumed, dataset)
    data.load_state_dict(saved)
    after, _ = fit(resumed, data, 27, rng)
    assert before + after == whole
    assert resumed.stats()["measured"] == sampler.stats()["measured"]


def test_the_default_max_lag_survives_a_resume_that_lost_one_update():
    dataset = Rows()
    first = create_sampler(config(), dataset)
    rng = np.random.default_rng(4)
    _, saved = fit(first, loader(first, dataset), 5, rng, save_at=4, skip={4})
    resumed = create_sampler(config(), dataset)
    data = loader(resumed, dataset)
    data.load_state_dict(saved)
    fit(resumed, data, 3, rng)
    assert resumed.stats()["updates"] == 4 + 3


def test_a_draw_with_updates_missing_is_refused():
    sampler = VerlPromptSampler(range(40), {"train_batch_size": 4})
    order = iter(sampler)
    for _ in range(8):  # two batches, no update: the third is two batches ahead
        next(order)
    with pytest.raises(RuntimeError, match=r"2 batches drawn before this one still await update\(batch\) "
                                           r"\(data.sampler.max_lag=1\): set data.dataloader_num_workers=0"):
        next(order)


def test_max_lag_null_in_the_config_only_measures():
    """``max_lag: null`` in verl's YAML means what ``max_lag=None`` means in Python (no bound), not the default."""
    sampler = VerlPromptSampler(range(40), {"train_batch_size": 4, "sampler": {"max_lag": None}})
    assert sampler.max_lag is None
    order = iter(sampler)
    for _ in range(20):  # five batches, no update
        next(order)
    assert sampler.stats()["max_lag_seen"] == 4


def test_bad_updates_are_named_and_change_nothing():
    sampler = VerlPromptSampler(range(40), {"train_batch_size": 4})
    order = iter(sampler)
    prompts = [next(order) for _ in range(4)]
    rng = np.random.default_rng(0)
    before = copy.deepcopy(sampler.prompts.state_dict())

    def refused(batch, match, error=ValueError):
        with pytest.raises(error, match=match):
            sampler.update(batch)
        after = sampler.prompts.state_dict()
        assert all(np.array_equal(after[k], before[k]) if isinstance(before[k], np.ndarray) else after[k] == before[k]
                   for k in before)

    good = rollout(prompts, rng)
    nan = copy.deepcopy(good)
    nan.batch["token_level_scores"][3, -1] = float("nan")
    refused(nan, r"the rewards in batch.batch\['token_level_scores'\] were refused: rewards must be finite")
    graded = copy.deepcopy(good)
    graded.batch["token_level_scores"][0, -1] = 0.5
    refused(graded, r"rewards must be 0 or 1 for Learnability .* data.sampler.rule=reward_spread")
    stranger = copy.deepcopy(good)
    stranger.non_tensor_batch["index"] = np.where(stranger.non_tensor_batch["index"] == prompts[0], 39 if
                                                  39 not in prompts else 38, stranger.non_tensor_batch["index"])
    refused(stranger, r"batch.non_tensor_batch\['index'\] holds 3[89], which this sampler did not hand out since "
                      r"the last update")
    mixed = copy.deepcopy(good)
    mixed.non_tensor_batch["uid"] = np.roll(mixed.non_tensor_batch["uid"], 1)
    refused(mixed, r"differs inside one group of 'uid'|same number")
    short = copy.deepcopy(good)
    short.non_tensor_batch["uid"] = short.non_tensor_batch["uid"][:-1]
    refused(short, r"must have one entry per response")
    missing = copy.deepcopy(good)
    del missing.non_tensor_batch["uid"]
    refused(missing, r"batch.non_tensor_batch has no 'uid'")
    refused(object(), "batch must be a verl DataProto", TypeError)
    sampler.update(good)
    assert sampler.stats()["groups"] == 4


def test_bad_config_is_named():
    with pytest.raises(ValueError, match=r"data.sampler has unknown keys \['exploraton'\]"):
        VerlPromptSampler(range(40), {"train_batch_size": 4, "sampler": {"exploraton": 0.1}})
    with pytest.raises(ValueError, match=r"data.sampler.rule must be one of \('learnability', 'reward_spread', "
                                         r"'uniform'\), got 'p1p'"):
        VerlPromptSampler(range(40), {"train_batch_size": 4, "sampler": {"rule": "p1p"}})
    with pytest.raises(ValueError, match="batch_size must be an integer in \\[1, 40\\]"):
        VerlPromptSampler(range(40), {"train_batch_size": 41})
    with pytest.raises(ValueError, match="exploration must be a finite number"):
        VerlPromptSampler(range(40), {"train_batch_size": 4, "sampler": {"exploration": 2.0}})
    sampler = VerlPromptSampler(range(40), {"train_batch_size": 4})
    state = sampler.state_dict()
    state["offset"] = 7
    with pytest.raises(InvalidState, match="offset"):
        sampler.load_state_dict(state)
    state = sampler.state_dict()
    state["batch_retest"] = np.zeros(len(state["batch_indices"]) + 1, bool)
    with pytest.raises(InvalidState, match=r"\['batch_retest'\] must hold one retest flag per entry of "
                                           r"'batch_indices' \(0\), got 1"):
        sampler.load_state_dict(state)


def test_the_docstring_example_runs():
    import doctest

    from replayloader.prompts import verl as module

    result = doctest.testmod(module)
    assert result.attempted and not result.failed
