"""Same seeds, same run: every named strategy's sampled ids, probabilities, importance weights and final weights
are pinned to the values the code gave before the redesign that moved each rule into its strategy part
(commit 9454591, measured with this very function). A change here is a change of behaviour, not a refactor."""
import hashlib

import numpy as np
import pytest

from replayloader import ReplayBuffer, strategies

PINNED = {  # name: (sha256 prefix of all sampled ids, sum of IS weights + probabilities, final weight sum)
    "grad_bound": ("6e58730205bd0397", 435.857537104, 84.134616562),
    "grad_norm": ("6e58730205bd0397", 435.857537104, 84.134616562),
    "linucb": ("df9b2ece0933f530", 379.917174672, 56.19239031),
    "loss": ("6e58730205bd0397", 435.857537104, 84.134616562),
    "loss_diff": ("135484255a02a241", 463.24302719, 65.33541809),
    "lsr": ("3b6383d5c4e9a440", 384.316212026, 60.195988355),
    "none": ("d129e6e6c705aa3e", 510.0, 64.0),
    "per": ("60d0d469ba5ccc93", 176.87022478, 89.028076354),
}


def trace(name: str) -> tuple[str, float, float]:
    buf = ReplayBuffer(64, alpha=0.7, beta=0.4, strategy=strategies.by_name(name), seed=11)
    rng = np.random.default_rng(5)
    ids_seen, weights_sum = [], 0.0
    key = buf.strategy.update.feedback_key or "loss"
    for _ in range(30):
        buf.add({"input_ids": rng.integers(0, 40, (16, 6))})
        s = buf.sample(16)
        ids_seen.append(s.ids.copy())
        buf.feedback(s.ids, **{key: rng.uniform(0.0, 2.0, 16)})
        weights_sum += float(s.weights.sum()) + float(s.probabilities.sum())
    digest = hashlib.sha256(np.concatenate(ids_seen).astype(np.int64).tobytes()).hexdigest()[:16]
    return digest, weights_sum, float(buf.weights.sum())


def test_every_strategy_is_pinned():
    assert sorted(PINNED) == strategies.strategy_names()


@pytest.mark.parametrize("name", sorted(PINNED))
def test_same_seed_same_stream_as_before_the_redesign(name):
    digest, weights_sum, final = trace(name)
    expected_digest, expected_sum, expected_final = PINNED[name]
    assert digest == expected_digest
    assert weights_sum == pytest.approx(expected_sum, rel=1e-9)
    assert final == pytest.approx(expected_final, rel=1e-9)
