"""A checkpoint directory that verifies without a run (config-only tests), built with the writer's own manifest."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from integrations.electra.pretrain.checkpoint import CHECKPOINT_FORMAT, write_state


def write_config_only_checkpoint(step_dir: Path, config, step: int, ranks: int = 1) -> Path:
    """``step_dir`` with placeholder tensors and rank files, and a state.json holding ``config`` and a manifest."""
    step_dir.mkdir(parents=True)
    save_file({"placeholder": np.zeros(1)}, str(step_dir / "tensors.safetensors"))
    for rank in range(ranks):
        save_file({"placeholder": np.zeros(1)}, str(step_dir / f"rank-{rank:05d}.safetensors"))
        (step_dir / f"rank-{rank:05d}.json").write_text(json.dumps({"step": step}))
    write_state(step_dir, {"format": CHECKPOINT_FORMAT, "step": step, "config": config.to_json(), "world_size": ranks})
    return step_dir
