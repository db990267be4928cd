"""1.1 moved the mixture's torch adapters to ``replayloader.torch`` (one home for every adapter): the 1.0 paths,
the modules ``replayloader.mixing.torch`` / ``.hf`` and the names on ``replayloader.mixing``'s face, still work
for one release, each the new object, with a DeprecationWarning naming where it lives now."""
import subprocess
import sys

import pytest

pytest.importorskip("torch")

CODE = """
import importlib, warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    old = importlib.import_module({old!r})
new = importlib.import_module({new!r})
print(old is new)
for w in caught:
    print(w.category.__name__, w.message)
"""


@pytest.mark.parametrize("old, new, extra", [
    ("replayloader.mixing.torch", "replayloader.torch.mixing", "torch"),
    ("replayloader.mixing.hf", "replayloader.torch.mixing_trainer", "transformers"),
])
def test_the_old_module_path_is_the_new_module_with_one_warning_naming_it(old, new, extra):
    pytest.importorskip(extra)
    done = subprocess.run([sys.executable, "-c", CODE.format(old=old, new=new)], capture_output=True, text=True,
                          check=True)
    assert done.stdout.splitlines() == [
        "True", f"DeprecationWarning {old} moved to {new} in replayloader 1.1; the old path will be removed in the "
                "next release"]


@pytest.mark.parametrize("name", ["MixtureBatchSampler", "MixtureIterableDataset", "concat_sources",
                                  "MixingTrainer"])
def test_the_old_name_on_the_mixing_face_is_the_torch_one_with_a_warning_naming_it(name):
    if name == "MixingTrainer":
        pytest.importorskip("transformers")
    import replayloader.mixing
    import replayloader.torch

    with pytest.warns(DeprecationWarning, match=rf"replayloader\.mixing\.{name} moved to "
                                                rf"replayloader\.torch\.{name} in replayloader 1\.1"):
        old = getattr(replayloader.mixing, name)
    assert old is getattr(replayloader.torch, name)
    assert name not in replayloader.mixing.__all__ and name in replayloader.torch.__all__
