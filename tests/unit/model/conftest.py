from __future__ import annotations

import pytest
import torch

from krill.model.build import TinyModelSpec, build_tiny_model

SMALL = TinyModelSpec(hidden=32, layers=4, heads=2, intermediate=64, max_positions=32)


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """One torch thread: tiny models gain nothing from more, and a busy machine loses a lot."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def small_spec():
    """A tiny Llama shape that builds and runs in milliseconds."""
    return SMALL


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A random tiny model saved as an HF directory."""
    path = tmp_path_factory.mktemp("tiny")
    build_tiny_model(seed=1, spec=SMALL, directory=path)
    return path


@pytest.fixture
def store(tmp_path):
    from krill.store.local import LocalStore

    return LocalStore(tmp_path / "store")
