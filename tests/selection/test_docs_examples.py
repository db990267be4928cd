"""The python blocks of docs/selection.md's sections on the cheaper-selection parts run as written, and print
what their comments say."""
import warnings

from tests.docs_blocks import block


def run(after, capsys):
    exec(compile(block("docs/selection.md", after), f"docs/selection.md: {after}", "exec"), {})
    return capsys.readouterr().out.split("\n")


def test_the_irreducible_loss_example_fits_once_loads_once_and_refuses_other_inputs(capsys):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # its IL model beats its target: the only warning is the refit's
        refused, damaged, refit, fitted, amortized, _ = run("## A validated irreducible-loss model", capsys)
    assert [str(w.message).split(":")[0] for w in caught] == [
        "refitting the irreducible-loss model, as on_invalid='refit' asks"]
    assert refused == "['label_noise_seed']"
    assert damaged.startswith(".../il.npz: not a readable state archive (truncated or damaged?)")
    assert damaged.endswith("; delete it, or pass on_invalid='refit', to fit the irreducible-loss model again")
    assert refit == "False True"
    shape, best_step, quality, loaded = fitted.split(" ", 1)[0], *fitted.rsplit(" ", 3)[1:]
    assert shape == "(300,)" and 20 <= int(best_step) <= 200 and 0.6 <= float(quality) <= 1.0 and loaded == "True"
    assert amortized == "True"


def test_the_reused_pool_example_trains_four_steps_per_scored_pool(capsys):
    assert run("## Reused pools", capsys)[0] == "1280 2.5"


def test_the_stale_tree_example_rarely_draws_rows_the_irreducible_loss_model_finds_implausible(capsys):
    assert run("## Stale reducible loss in the sum tree", capsys)[0] == "True"


def test_the_switch_example_selects_then_stops_past_the_irreducible_loss_model(capsys):
    stopped, fraction, reason = run("## The automatic switch", capsys)[0].split(" ", 2)
    assert stopped == "True" and 0.0 < float(fraction) < 0.5 and reason.startswith("window ")


def test_the_switching_trainer_recipe_skips_the_scoring_forward_in_uniform_steps(capsys):
    import pytest

    pytest.importorskip("transformers")
    steps, selecting, scored = map(int, run("**A switching Trainer:**", capsys)[-2].split())
    assert steps == 12 and 0 < selecting < 12 and scored == 16 * selecting  # only selection steps scored a pool
