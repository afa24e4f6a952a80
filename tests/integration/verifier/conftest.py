"""Fixtures of the verifier's integration tests (helpers live in `verifier_env`, a unique module name)."""

from __future__ import annotations

import pytest
from verifier_env import start_run_env


@pytest.fixture(scope="module")
def run_env(tmp_path_factory, request):
    env = start_run_env(tmp_path_factory, request.module.__name__.rsplit(".", 1)[-1].replace("_", "-")[:40])
    yield env
    env.anvil.stop()
