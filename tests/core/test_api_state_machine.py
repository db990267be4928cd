"""Stateful fuzzing of the whole public API of ReplayBuffer and ReplayDataLoader against a numpy model.

The CI run is sized to take well under a minute; `checks/fuzz_api.py` runs the same machine much longer.
"""
import os

from hypothesis import HealthCheck, settings

from .api_machine import BufferAPIMachine

CI_EXAMPLES = int(os.environ.get("REPLAYLOADER_FUZZ_EXAMPLES", 2000))

TestBufferAPI = BufferAPIMachine.TestCase
TestBufferAPI.settings = settings(max_examples=CI_EXAMPLES, stateful_step_count=12, deadline=None,
                                  derandomize=True, suppress_health_check=list(HealthCheck))
