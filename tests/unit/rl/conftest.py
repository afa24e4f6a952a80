"""Fixtures of the RL unit tests."""

import pytest
from rl_tiny import tiny_llama


@pytest.fixture
def model():
    return tiny_llama()
