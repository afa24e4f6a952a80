"""`nan` and `inf` in a float setting are refused as not finite, naming the key and the override that set them
(the message used to be the field's upper bound, "less than or equal to 300", for `nan` too)."""

from __future__ import annotations

import pytest

from krill.config import load_config
from krill.errors import ConfigError


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("key", ["chain.request_timeout_s", "worker.poll_interval_s", "worker.watch_interval_s"])
def test_non_finite_floats_are_refused_as_such(tmp_path, monkeypatch, key, value):
    monkeypatch.setenv("KRILL_HOME", str(tmp_path))  # no devnet config to fall back on
    monkeypatch.delenv("KRILL_CONFIG", raising=False)
    env = {"KRILL_HOME": str(tmp_path)}
    with pytest.raises(ConfigError) as caught:
        load_config(None, [f"{key}={value}"], environ=env)
    assert str(caught.value) == f"invalid configuration: {key}: Input should be a finite number (from --set {key})"
