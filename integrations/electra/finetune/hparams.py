"""Fine-tuning hyperparameters of ELECTRA (Clark et al. 2020), as presets that every flag can override.

batch 32, 10% linear warmup then linear decay to 0, layer-wise LR decay, Adam(β=(0.9, 0.999),
ε=1e-6), weight decay 0.01 (not on LayerNorm/bias), gradient clipping 1.0, max length 128,
3 epochs (10 for RTE and STS-B, 2 for SQuAD). Learning rate and layer decay by model size, from the
ELECTRA paper's fine-tuning table: small 3e-4 / 0.8, base 1e-4 / 0.8, large 5e-5 / 0.9 (the
reference code's default is 1e-4 for every size below large).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .errors import FinetuneError


@dataclass(frozen=True)
class Preset:
    learning_rate: float
    layer_decay: float


PRESETS: dict[str, Preset] = {
    "small": Preset(learning_rate=3e-4, layer_decay=0.8),
    "base": Preset(learning_rate=1e-4, layer_decay=0.8),
    "large": Preset(learning_rate=5e-5, layer_decay=0.9),
}


def preset_for_hidden_size(hidden_size: int) -> str:
    """ELECTRA sizes: small 256, base 768, large 1024 (smaller test models count as small)."""
    if hidden_size <= 256:
        return "small"
    if hidden_size <= 768:
        return "base"
    return "large"


@dataclass(frozen=True)
class FinetuneConfig:
    learning_rate: float
    layer_decay: float = 0.8
    epochs: float = 3
    batch_size: int = 32
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    adam_epsilon: float = 1e-6
    max_grad_norm: float = 1.0
    eval_batch_size: int = 64
    preset: str = "small"
    use_amp: bool = False  # bf16 autocast, only ever applied on CUDA
    sampling: str = "uniform"  # "prioritized": batches from replayloader's PrioritizedSampler, fed the losses


def resolve_config(
    hidden_size: int,
    default_epochs: float,
    *,
    preset: str | None = None,
    learning_rate: float | None = None,
    layer_decay: float | None = None,
    epochs: float | None = None,
    batch_size: int | None = None,
    **overrides,
) -> FinetuneConfig:
    """The preset chosen by name or by the checkpoint's hidden size, with explicit values on top."""
    preset_name = preset or preset_for_hidden_size(hidden_size)
    if preset_name not in PRESETS:
        raise FinetuneError(f"unknown preset {preset_name!r}; choose from {', '.join(PRESETS)}")
    chosen = PRESETS[preset_name]
    config = FinetuneConfig(
        learning_rate=chosen.learning_rate if learning_rate is None else learning_rate,
        layer_decay=chosen.layer_decay if layer_decay is None else layer_decay,
        epochs=default_epochs if epochs is None else epochs,
        batch_size=32 if batch_size is None else batch_size,
        preset=preset_name,
    )
    config = replace(config, **{k: v for k, v in overrides.items() if v is not None})
    if config.sampling not in ("uniform", "prioritized"):
        raise FinetuneError(f"sampling must be 'uniform' or 'prioritized', got {config.sampling!r}")
    if config.learning_rate <= 0 or config.batch_size <= 0 or config.epochs <= 0:
        raise FinetuneError(f"learning rate, batch size and epochs must be positive (got {config})")
    return config
