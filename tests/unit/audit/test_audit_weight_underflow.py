"""The audit judges a rejection as below the trust floor the way `coordinator/trust.py` makes it: a trust at
or above the floor whose weight is not positive (floor 0, a tiny prior, an `exp` staleness shape) stands."""

from __future__ import annotations

from types import SimpleNamespace

from krill.audit.entries import false_standing, unreachable_trust
from krill.payload.limits import PayloadLimits
from krill.protocol.spec import RunSpec, TrustSpec
from krill.rl.staleness import StalenessConfig


def _source(trust: TrustSpec, staleness: StalenessConfig, commit_version: int, fails: int = 0):
    spec = RunSpec(name="unit", base_manifest_cid="bafkreifjjcie6lypi6ny7amxnfftagclbuxndqonfipmb64f2km2devei4",
                   limits=PayloadLimits(vocab_size=16), trust=trust, staleness=staleness)
    return SimpleNamespace(spec=spec, verdict_counts=lambda worker, before: (0, fails),
                           version_info=lambda v: SimpleNamespace(published_block=100),
                           commit=lambda c: SimpleNamespace(version=commit_version))


def test_a_weight_that_underflows_bears_out_a_below_floor_rejection():
    exp = StalenessConfig(kind="exp", tau=1.0, max_staleness=700)
    underflow = _source(TrustSpec(floor=0.0, prior_alpha=1e-300), exp, commit_version=0)
    assert false_standing(underflow, 701, 5, "0x" + "1" * 40, "below_trust_floor") is None
    # named in a later record, past S_max: the close that made it weighed it at most S_max old
    assert false_standing(underflow, 705, 5, "0x" + "1" * 40, "below_trust_floor") is None
    zero = _source(TrustSpec(floor=0.0, prior_alpha=5e-324), StalenessConfig(), commit_version=3)
    assert false_standing(zero, 4, 5, "0x" + "1" * 40, "below_trust_floor") is None


def test_a_positive_weight_above_the_floor_contradicts_the_rejection():
    fresh = _source(TrustSpec(floor=0.0, prior_alpha=1e-300), StalenessConfig(kind="exp", tau=1.0, max_staleness=700),
                    commit_version=699)  # staleness 1: exp(-1) x 3e-301 is positive
    said = false_standing(fresh, 701, 5, "0x" + "1" * 40, "below_trust_floor")
    assert said is not None and "not below the floor" in said
    default = _source(TrustSpec(), StalenessConfig(), commit_version=0, fails=16)  # 1 / 20 = 0.05: at the floor
    assert false_standing(default, 1, 5, "0x" + "1" * 40, "below_trust_floor") is not None
    assert false_standing(_source(TrustSpec(), StalenessConfig(), 0, fails=17), 1, 5, "0x" + "1" * 40,
                          "below_trust_floor") is None


def test_a_trust_no_verdicts_reach_fails_its_check_even_where_the_arithmetic_overflows():
    """With a floor of 0 a record may claim trust 1e-320: prior_alpha / trust overflows, and the check raised
    OverflowError, ending the version's audit as an internal fault before its other checks."""
    source = _source(TrustSpec(floor=0.0), StalenessConfig(), commit_version=0, fails=3)
    for trust in (1e-320, 5e-324):
        said = unreachable_trust(source, 1, "0x" + "1" * 40, trust)
        assert said is not None and f"trust {trust!r} is not (prior" in said
    assert unreachable_trust(source, 1, "0x" + "1" * 40, 1 / (1 + 3 + 3)) is None  # three failing verdicts
