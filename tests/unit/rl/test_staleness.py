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


def test_exp_weights_that_would_underflow_are_refused():
    # tau = 0.001 gave weight 0.0 at s = 1: the coordinator accepted such contributions, the fold refused a
    # version of only them and the audit failed every version that folded one.
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="too small for S_max = 2"):
        StalenessConfig(kind="exp", tau=0.001, max_staleness=2)
    with pytest.raises(ValidationError, match="S_max / tau must be at most 700"):
        StalenessConfig(kind="exp", tau=1.0, max_staleness=1000)
    config = StalenessConfig(kind="exp", tau=1.0, max_staleness=700)
    assert all(staleness_weight(s, config) * 3e-4 >= 2.2250738585072014e-308 for s in range(701))
    assert StalenessConfig(kind="inverse", tau=0.001, max_staleness=1000).kind == "inverse"  # tau unused there
