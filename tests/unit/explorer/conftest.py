"""The explorer's unit tests read a small hand-filled index (`krill.testing.index_world`) on SQLite."""

from __future__ import annotations

import pytest

from krill.testing.index_world import fill_index_world


@pytest.fixture
def explorer_world(tmp_path):
    """(database URL, store, facts) of the hand-filled index in a fresh SQLite file."""
    return fill_index_world(f"sqlite:///{tmp_path / 'krill.db'}", tmp_path)
