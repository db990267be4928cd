"""The package's architecture, checked: folders in layers with no import cycle and no upward arrow, a top level
that exports features (not plumbing) without importing torch, and the 0.1 import paths still working for one
release with a DeprecationWarning."""
from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import replayloader
from replayloader._moved import FRONT_1_1, MOVED_MODULES, MOVED_NAMES

PACKAGE = Path(replayloader.__file__).parent
# Lower layers never import higher ones. A folder may import its own layer's other folders only where listed.
LAYERS = [
    {"_arrays", "_checks", "_moved", "kernels", "state", "schedules"},
    {"sumtree", "strategies"},
    {"buffer"},
    {"sampler", "loader"},
    {"selection", "mixing"},
    {"distributed"},
    {"torch", "ray", "sb3"},
    {"prompts"},
]
LAYER = {part: number for number, parts in enumerate(LAYERS) for part in parts}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_level_imports(path: Path) -> set[str]:
    """replayloader modules imported when ``path`` is imported (function-level imports are lazy by design)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("replayloader"):
                if node.module:  # `from .x import y`: module x (y may be a submodule too)
                    found.add(target)
                # `from .. import x` needs x only: the package itself is already importing, by definition
                found.update(f"{target}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("replayloader"))
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    return {target for target in found if target in modules and target != name}


def graph() -> dict[str, set[str]]:
    return {module_name(p): module_level_imports(p) for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}


def part(module: str) -> str | None:
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else None


def test_no_module_imports_from_a_higher_layer():
    upward = []
    for module, targets in graph().items():
        if part(module) is None:  # replayloader/__init__: the public face re-exports from every layer
            continue
        for target in targets:
            if part(target) is not None and LAYER[part(target)] > LAYER[part(module)]:
                upward.append(f"{module} -> {target}")
    assert not upward


def test_the_import_graph_has_no_cycle():
    edges = graph()
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in edges.get(node, ()):
            if state.get(target) == 1:
                raise AssertionError(" -> ".join(path[path.index(target):] + [target]) if target in path
                                     else f"{node} -> {target}")
            if target not in state:
                visit(target, path + [target])
        state[node] = 2

    for node in edges:
        if node not in state:
            visit(node, [node])


def test_every_folder_has_a_public_face_that_lists_what_it_exports():
    for folder in sorted(p for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
        module = importlib.import_module(f"replayloader.{folder.name}") if folder.name not in ("ray", "sb3") else None
        if module is None:
            continue
        assert module.__doc__, folder.name
        exported = getattr(module, "__all__", None)
        if folder.name != "kernels":  # compiled kernels: internal, no public face by design
            assert exported, folder.name
            for name in exported:
                assert hasattr(module, name), f"replayloader.{folder.name}.{name}"


def test_import_replayloader_exports_features_and_errors_not_plumbing_and_never_loads_torch():
    code = ("import sys, replayloader; assert 'torch' not in sys.modules, 'torch imported'; "
            "print(sorted(replayloader.__all__))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    exported = set(eval(done.stdout))
    for feature in ("ReplayBuffer", "ReplayDataLoader", "PrioritizedSampler", "PrioritizedBatchSampler", "Selector",
                    "ScoreThenSelect", "DistributedPrioritizedSampler", "InvalidState", "WorkerError"):
        assert feature in exported
    assert not exported & set(MOVED_NAMES)  # SumTree, Storage, LockedBuffer, ...: reachable from their homes
    assert not exported & set(FRONT_1_1)  # 1.1's small front: the rest is in the subpackages
    assert len(exported) <= 20, sorted(exported)  # what a user starts from, plus the errors


def test_the_names_that_left_the_front_in_1_1_still_import_with_a_warning_naming_their_home():
    """One process for all of them: each old top-level name is its home's object, with one DeprecationWarning
    saying where it lives now."""
    names = sorted(name for name, home in FRONT_1_1.items()
                   if importlib.util.find_spec("torch") is not None or home not in ("replayloader.torch",)
                   and name not in ("MixtureBatchSampler", "MixtureIterableDataset", "concat_sources"))
    code = ("import importlib, warnings, replayloader\n"
            "from replayloader._moved import FRONT_1_1\n"
            f"for name in {names!r}:\n"
            "    with warnings.catch_warnings(record=True) as caught:\n"
            "        warnings.simplefilter('always')\n"
            "        value = getattr(replayloader, name)\n"
            "    home = importlib.import_module(FRONT_1_1[name])\n"
            "    assert value is getattr(home, name), name\n"
            "    mine = [w for w in caught if w.category is DeprecationWarning and 'replayloader.' + name in str(w.message)]\n"
            "    print(name, len(mine), mine[0].message if mine else '')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = done.stdout.splitlines()
    assert len(lines) == len(names)
    for name, line in zip(names, lines):
        assert line.startswith(f"{name} 1 replayloader.{name} moved to {FRONT_1_1[name]}.{name} in replayloader 1.1"), line


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_an_old_module_path_is_the_new_module_with_a_deprecation_warning(old):
    extras = {"ray.": "ray", "torch_": "torch", "hf_trainer": "transformers", "lightning": "lightning"}
    for marker, extra in extras.items():
        if marker in old:
            pytest.importorskip(extra)
    code = (f"import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
            f"import replayloader, importlib\n"
            f"try:\n    importlib.import_module({old!r})\n"
            f"except DeprecationWarning as w:\n    print(w)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert f"{old} moved to {MOVED_MODULES[old]}" in done.stdout
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert importlib.import_module(old) is importlib.import_module(MOVED_MODULES[old])


def test_the_feedback_rule_moved_to_strategies_and_its_old_paths_warn_naming_the_new_home():
    """1.1 moved ``buffer/feedback.py`` to ``strategies/`` (the rule is the update's). Both old paths, 1.0's
    ``replayloader.buffer.feedback`` and 0.1's ``replayloader.feedback``, are the new module, with a warning."""
    code = ("import warnings; warnings.simplefilter('always')\n"
            "import replayloader.strategies.feedback as new\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    from replayloader.buffer.feedback import read_feedback, check_values\n"
            "    import replayloader.feedback as oldest\n"
            "assert read_feedback is new.read_feedback and check_values is new.check_values and oldest is new\n"
            "for w in caught:\n"
            "    print(w.category.__name__, w.message)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines() == [
        "DeprecationWarning replayloader.buffer.feedback moved to replayloader.strategies.feedback in replayloader 1.1;"
        " the old path will be removed in the next release",
        "DeprecationWarning replayloader.feedback moved to replayloader.strategies.feedback in replayloader 1.0;"
        " the old path will be removed in the next release"]
    assert not (PACKAGE / "buffer" / "feedback.py").exists()


@pytest.mark.parametrize("name", sorted(MOVED_NAMES))
def test_plumbing_that_left_the_top_level_still_imports_with_a_warning(name):
    code = (f"import warnings; warnings.simplefilter('always')\n"
            f"with warnings.catch_warnings(record=True) as caught:\n"
            f"    from replayloader import {name}\n"
            f"print(len(caught), caught[0].category.__name__, caught[0].message)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.startswith(f"1 DeprecationWarning replayloader.{name} moved to {MOVED_NAMES[name]}.{name}")


def feedback_families():
    """Every class with the feedback verb: the numpy ones here, the torch ones where torch is installed."""
    from replayloader import PrioritizedSampler, ReplayBuffer
    from replayloader.buffer import LockedBuffer

    yield ReplayBuffer(8, seed=0), lambda b: (b.add({"x": np.arange(4.0)[:, None]}), {"loss": np.ones(4)})
    yield LockedBuffer(ReplayBuffer(8, seed=0)), lambda b: (b.add({"x": np.arange(4.0)[:, None]}), {"loss": np.ones(4)})
    yield PrioritizedSampler(8, 4, seed=0), lambda s: (s.next_batch(), {"loss": np.ones(4)})
    if importlib.util.find_spec("torch") is not None:
        from replayloader.torch import PrioritizedBatchSampler

        yield PrioritizedBatchSampler(PrioritizedSampler(8, 4, seed=0)), lambda s: (next(iter(s)), {"loss": np.ones(4)})


@pytest.mark.parametrize("family", range(4))
def test_the_one_feedback_verb_and_its_deprecated_0_1_name_do_the_same(family):
    """1.0 has one verb, ``feedback``, on buffers, samplers and loaders. ``update`` (0.1's name on buffers and
    samplers) still works for one release: it warns once per read and reaches the very same method."""
    found = list(feedback_families())
    if family >= len(found):
        pytest.skip("torch not installed")
    obj, handed_out = found[family]
    handle, feedback = handed_out(obj)
    with pytest.warns(DeprecationWarning, match=rf"{type(obj).__name__}\.update is deprecated .*use \.feedback"):
        old = obj.update
    assert old == obj.feedback
    old(handle, **feedback)
    assert old(handle, loss=3 * feedback["loss"]) > 0  # a second loss: the default LossDifference changes weights too


def test_the_integration_imports_only_names_in_a_public_face():
    """docs/architecture.md: the ELECTRA integration uses the library as any user would, through the public faces
    (``replayloader`` and its subpackages' ``__init__``), importing only names in their ``__all__``."""
    pytest.importorskip("torch")  # replayloader.distributed and .torch need it
    integration = PACKAGE.parent / "integrations" / "electra"
    wrong = []
    for path in sorted(integration.rglob("*.py")):
        where = path.relative_to(integration)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("replayloader"):
                if node.module.count(".") > 1:
                    wrong.append(f"{where}: from {node.module} (not a public face)")
                    continue
                public = getattr(importlib.import_module(node.module), "__all__", ())
                wrong += [f"{where}: from {node.module} import {a.name}" for a in node.names if a.name not in public]
            elif isinstance(node, ast.Import):
                wrong += [f"{where}: import {a.name}" for a in node.names if a.name.startswith("replayloader.")]
    assert not wrong
