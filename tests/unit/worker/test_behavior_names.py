"""The worker's strategies and the names the core's `worker.behavior` admits (`krill.config.WORKER_BEHAVIORS`).

The core validates `worker.behavior` without importing the worker's folder (STYLE.md: the core never
imports a role); the worker's registry checks itself against the core's list at import.
"""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_the_registry_and_the_cores_list_name_the_same_strategies():
    from krill.config import WORKER_BEHAVIORS
    from krill.worker.behaviors import BEHAVIORS, check_registry

    assert sorted(BEHAVIORS) == sorted(WORKER_BEHAVIORS)
    check_registry(BEHAVIORS)
    with pytest.raises(RuntimeError, match=r"not in the registry \['withhold'\]"):
        check_registry([n for n in BEHAVIORS if n != "withhold"])
    with pytest.raises(RuntimeError, match=r"not in WORKER_BEHAVIORS \['new-attack'\]"):
        check_registry([*BEHAVIORS, "new-attack"])


def test_validating_worker_behavior_imports_no_role():
    code = ("import sys\n"
            "from krill.config import KrillConfig\n"
            "from krill.errors import ConfigError\n"
            "assert KrillConfig.model_validate({'worker': {'behavior': 'lazy'}}).worker.behavior == 'lazy'\n"
            "try:\n"
            "    KrillConfig.model_validate({'worker': {'behavior': 'lazzy'}})\n"
            "except ValueError as exc:\n"
            "    assert \"unknown strategy 'lazzy'; choose one of alie, cherry-pick\" in str(exc), exc\n"
            "else:\n"
            "    raise SystemExit('lazzy accepted')\n"
            "from krill.demo.orchestrate import DemoConfig\n"
            "DemoConfig(attacks=['sign-flip'])\n"
            "roles = sorted(m for m in sys.modules if m.split('.')[:2] in (['krill', 'worker'], ['krill', 'verifier'],\n"
            "                                                         ['krill', 'coordinator']))\n"
            "print(roles)\n"
            "raise SystemExit(1 if roles else 0)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
