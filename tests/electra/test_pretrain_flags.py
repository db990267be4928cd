"""The model-size and masking flags of ``pretrain`` reach the config and the models built from it."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from integrations.electra import cli  # noqa: E402
from integrations.electra.models import PRESETS, build_electra_pair, electra_configs, with_overrides  # noqa: E402

VOCAB, PAD = 120, 0


def configs_for(*flags: str):
    """(pretrain config, generator HF config, discriminator HF config) as `pretrain` would build them."""
    args = cli.build_parser().parse_args(["pretrain", "--variant", "electra", *flags])
    config = cli.config_from_args(args, "electra", "unused-output-dir").filled()
    pair = build_electra_pair(config.model_preset(), VOCAB, PAD, config.dropout, seed=0)
    return config, pair.generator.config, pair.discriminator.config


def test_defaults_build_exactly_the_presets_models():
    for preset in ("tiny", "mini"):
        _, generator, discriminator = configs_for("--preset", preset)
        expected = electra_configs(with_overrides(PRESETS[preset]), VOCAB, PAD)
        assert generator.to_dict() == expected[0].to_dict()
        assert discriminator.to_dict() == expected[1].to_dict()
    config, generator, discriminator = configs_for()
    assert config.mask_prob == 0.15
    assert (generator.hidden_size, generator.intermediate_size, generator.num_hidden_layers) == (16, 64, 2)
    assert (discriminator.hidden_size, discriminator.intermediate_size, discriminator.embedding_size) == (64, 256, 64)


def test_mask_prob_flag():
    assert configs_for("--mask-prob", "0.25")[0].mask_prob == 0.25


def test_hidden_flag_sets_ffn_and_embedding_and_the_generator_follows():
    _, generator, discriminator = configs_for("--hidden", "96")
    assert (discriminator.hidden_size, discriminator.intermediate_size, discriminator.embedding_size) == (96, 384, 96)
    assert (generator.hidden_size, generator.intermediate_size, generator.embedding_size) == (24, 96, 96)


def test_layers_flag_sets_both_depths_by_default():
    _, generator, discriminator = configs_for("--layers", "3")
    assert discriminator.num_hidden_layers == 3 and generator.num_hidden_layers == 3


def test_generator_fraction_flag():
    _, generator, discriminator = configs_for("--generator-fraction", "0.125")
    assert (generator.hidden_size, generator.intermediate_size) == (8, 32)
    assert discriminator.hidden_size == 64


def test_generator_layers_flag():
    _, generator, discriminator = configs_for("--generator-layers", "1")
    assert generator.num_hidden_layers == 1 and discriminator.num_hidden_layers == 2


@pytest.mark.parametrize("argv, fragment", [
    (["--mask-prob", "1.5"], "--mask-prob must be in (0, 1), got 1.5"),
    (["--hidden", "63"], "--hidden must be a positive multiple of the preset's 2 heads, got 63"),
    (["--layers", "0"], "--layers must be >= 1, got 0"),
    (["--generator-fraction", "0"], "--generator-fraction must be in (0, 1], got 0.0"),
    (["--generator-fraction", "0.01"], "generator hidden size of 0"),
    (["--generator-layers", "0"], "--generator-layers must be >= 1, got 0"),
])
def test_bad_sizes_are_one_line_errors_naming_the_flag(argv, fragment, tmp_path, capsys):
    status = cli.main(["pretrain", "--variant", "electra", *argv, "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert status == 2 and fragment in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()  # rejected before anything is written
