import math

import pytest

from krill.rl.staleness import StalenessConfig, StalenessError, staleness_weight


def test_weights_by_shape():
    assert staleness_weight(2, StalenessConfig(kind="none")) == 1.0
    assert staleness_weight(2, StalenessConfig(kind="inverse")) == pytest.approx(1 / 3)
    assert staleness_weight(1, StalenessConfig(kind="exp", tau=2.0)) == pytest.approx(math.exp(-0.5))
    assert staleness_weight(0, StalenessConfig(kind="exp")) == 1.0


def test_hard_bound_and_future_rejected():
    with pytest.raises(StalenessError, match="S_max = 2"):
        staleness_weight(3, StalenessConfig(max_staleness=2))
    with pytest.raises(StalenessError, match="< 0"):
        staleness_weight(-1, StalenessConfig())
