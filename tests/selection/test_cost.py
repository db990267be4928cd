"""The cost model's two functions against the formulas written out, and their argument checks."""

import pytest
from hypothesis import given, settings, strategies as st

from replayloader.selection import break_even_step_ratio, step_cost_ratio


@settings(derandomize=True)
@given(st.integers(1, 2000), st.integers(1, 200), st.integers(1, 16), st.sampled_from([0.0, 1.0, 2.0, 3.5]))
def test_step_cost_ratio_is_scoring_plus_training_over_training(pool, chosen, reuse, backward):
    chosen = min(chosen, pool)
    expected = (pool / reuse + (1 + backward) * chosen) / ((1 + backward) * chosen)
    assert step_cost_ratio(pool, chosen, reuse=reuse, backward_cost=backward) == pytest.approx(expected, rel=1e-12)


def test_the_documented_examples():
    assert step_cost_ratio(320, 32) == pytest.approx(13 / 3)  # 4.33: RHO-LOSS's 10%, one pool per step
    assert step_cost_ratio(320, 32, reuse=4) == pytest.approx(11 / 6)  # 1.83
    assert break_even_step_ratio(13 / 3) == 13 / 3
    # the audit's bag model: a selection step 1.8x a uniform one, an IL model worth 6.5 uniform runs of 300 steps
    assert break_even_step_ratio(1.8, il_cost=6.5 * 300, select_steps=120) == pytest.approx(1.8 + 16.25)


@settings(derandomize=True)
@given(st.floats(0.5, 20.0), st.floats(0.0, 1e4), st.floats(1e-4, 1.0), st.integers(1, 5000))
def test_il_seconds_are_put_in_uniform_steps_by_the_uniform_steps_seconds(ratio, il_seconds, step_seconds, steps):
    expected = ratio + il_seconds / step_seconds / steps
    got = break_even_step_ratio(ratio, il_seconds=il_seconds, uniform_step_seconds=step_seconds, select_steps=steps)
    assert got == pytest.approx(expected, rel=1e-12)
    # the same bar as il_cost given in uniform steps
    assert got == pytest.approx(break_even_step_ratio(ratio, il_cost=il_seconds / step_seconds, select_steps=steps),
                                rel=1e-12)


@pytest.mark.parametrize("call, message", [
    (lambda: step_cost_ratio(10, 11), r"chosen must be an integer in \[1, 10\], got 11"),
    (lambda: step_cost_ratio(10, 2, reuse=0), "reuse must be an integer >= 1, got 0"),
    (lambda: step_cost_ratio(10, 2, backward_cost=-1), "backward_cost must be a finite number >= 0.0, got -1"),
    (lambda: break_even_step_ratio(0.0), "cost_ratio must be a finite number > 0.0, got 0.0"),
    (lambda: break_even_step_ratio(2.0, il_cost=5.0), "select_steps is needed"),
    (lambda: break_even_step_ratio(2.0, il_cost=-1.0), "il_cost must be a finite number >= 0.0, got -1.0"),
    (lambda: break_even_step_ratio(2.0, il_seconds=5.0, select_steps=10), "il_seconds needs uniform_step_seconds"),
    (lambda: break_even_step_ratio(2.0, uniform_step_seconds=0.01, il_cost=3.0, select_steps=10),
     "uniform_step_seconds=0.01 is only used with il_seconds"),
    (lambda: break_even_step_ratio(2.0, il_seconds=5.0, il_cost=3.0, uniform_step_seconds=0.01, select_steps=10),
     "give the IL model's cost once: il_seconds=5.0 .* or il_cost=3.0"),
    (lambda: break_even_step_ratio(2.0, il_seconds=5.0, uniform_step_seconds=0.0, select_steps=10),
     "uniform_step_seconds must be a finite number > 0.0, got 0.0"),
    (lambda: break_even_step_ratio(2.0, il_seconds=-5.0, uniform_step_seconds=0.01, select_steps=10),
     "il_seconds must be a finite number >= 0.0, got -5.0"),
    (lambda: break_even_step_ratio(2.0, il_seconds=5.0, uniform_step_seconds=0.01), "select_steps is needed"),
])
def test_bad_arguments_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()
