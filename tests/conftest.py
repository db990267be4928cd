"""The integration is imported as ``replayloader_electra`` (the name the wheel installs) from *this* checkout's
integrations/electra/, just as ``replayloader`` comes from this checkout's folder (pytest puts the checkout first
on sys.path). An editable install elsewhere (another worktree) maps that name through its own import hook,
which would otherwise win here and test that checkout's code instead."""
import importlib.util
import os
import sys
from pathlib import Path

import pytest

# Local copies of GLUE and SQuAD, where this workspace has them beside the checkout: the integration finds them
# through $REPLAYLOADER_DATA (its one data setting), so every test, and every process a test starts, uses them.
_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
if _DATA.is_dir():
    os.environ.setdefault("REPLAYLOADER_DATA", str(_DATA))

NAME, FOLDER = "replayloader_electra", Path(__file__).resolve().parents[1] / "integrations" / "electra"

if NAME not in sys.modules:
    spec = importlib.util.spec_from_file_location(NAME, FOLDER / "__init__.py", submodule_search_locations=[str(FOLDER)])
    sys.modules[NAME] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules[NAME])


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models run much faster on one thread, above all on a busy 2-core machine (the ELECTRA tests ask for
    it; the SB3 tests use it for every test)."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# Markers by place (registered in pyproject.toml): the fast run for contributors is
#   python -m pytest -m "not slow and not distributed and not ray"
_RAY = ("ray/",)
_DISTRIBUTED = ("distributed/", "mixing/test_distributed.py", "prompts/test_distributed.py",
                "prompts/test_trl_distributed.py", "selection/test_ddp.py", "electra/test_distributed.py")
_SLOW = ("electra/", "gpu/", "test_examples.py", "test_experiments.py", "test_wheel.py",
         "test_reproduce_tmr_records.py", "test_minatar.py", "test_gpu_check.py", "test_run_queue.py",
         "test_selection_torch.py", "test_readme.py", "test_readme_sampler.py", "sb3/test_cartpole_per.py",
         "sb3/test_minatar_driver.py", "sb3/test_sb3_seconds.py", "sb3/test_algorithms.py",
         "sb3/test_actor_critic.py", "sb3/test_docs_example.py", "mixing/test_fair_study.py", "mixing/test_hf.py",
         "prompts/test_trl.py", "prompts/test_verl.py", "selection/test_hf_parts.py", "core/test_stress.py")
# Single tests of otherwise fast files that take 5 s or more each on this project's loaded 2-core machine
_SLOW_TESTS = ("mixing/test_torch.py::test_resume_through_a_two_worker_dataloader_continues_identically",
               "mixing/test_torch.py::test_feedback_through_a_dataloader_moves_the_weights",
               "mixing/test_torch.py::test_two_workers_with_pin_memory_give_the_no_worker_stream_without_feedback",
               "mixing/test_torch.py::test_with_workers_a_batch_is_drawn_prefetch_batches_ahead",
               "mixing/test_ado.py::test_ado_matches_the_numpy_reference_step_by_step",
               "mixing/test_ado.py::test_fit_reaches_the_minimum_scipy_finds_from_the_same_starts",
               "mixing/test_ado.py::test_state_round_trip_resumes_exactly",
               "mixing/test_docs_example.py", "core/test_api_state_machine.py",
               "selection/test_docs_examples.py::test_the_switching_trainer_recipe_skips_the_scoring_forward",
               "test_torch_sampler.py::test_trainer_recipe_trains_on_prioritized_batches_and_feeds_the_loss_back",
               "prompts/test_docs.py::test_the_trl_trainer")
_TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        try:
            where = Path(str(item.fspath)).resolve().relative_to(_TESTS).as_posix()
        except ValueError:
            continue
        for marker, places in (("ray", _RAY), ("distributed", _DISTRIBUTED), ("slow", _SLOW)):
            if any(where == place or (place.endswith("/") and where.startswith(place)) for place in places):
                item.add_marker(marker)
        test = where + "::" + item.nodeid.split("::", 1)[-1]
        if any(test.startswith(prefix) for prefix in _SLOW_TESTS):
            item.add_marker("slow")
