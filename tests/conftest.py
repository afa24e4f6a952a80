"""Suite-wide fixtures: every test gets its own KRILL_HOME and no inherited Krill configuration."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _isolated_krill_home(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("krill-home")
    monkeypatch.setenv("KRILL_HOME", str(home))
    for name in list(os.environ):
        if name == "KRILL_CONFIG" or (name.startswith("KRILL_") and "__" in name):
            monkeypatch.delenv(name, raising=False)
    yield home
