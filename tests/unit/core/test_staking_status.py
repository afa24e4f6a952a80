"""Token amounts typed by people, and the next-step hints of a participant's status, without a chain."""

from __future__ import annotations

import pytest

from krill.account_status import AccountStatus, hints
from krill.staking import TOKEN, StakingError, parse_tokens, tokens


@pytest.mark.parametrize(("text", "units"), [("500", 500 * TOKEN), ("12.5", 25 * TOKEN // 2),
                                              ("0.000000000000000001", 1), ("1e3", 1000 * TOKEN)])
def test_amounts_are_tokens_exactly(text, units):
    assert parse_tokens(text) == units
    assert parse_tokens(tokens(units)) == units


@pytest.mark.parametrize("text", ["0", "-5", "ten", "0.0000000000000000001", "nan", "inf"])
def test_bad_amounts_say_what_is_expected(text):
    with pytest.raises(StakingError, match="--amount"):
        parse_tokens(text)


def _status(**changes) -> AccountStatus:
    base = dict(role="worker", address="0xabc", staked_as="worker", staked=200 * TOKEN, unbonding=0, release_block=0,
                head_block=10, jailed=False, minimum=100 * TOKEN, eligible=True, claimable=0, earned=0, claimed=0,
                trust=None, trust_note="unknown (no index)", index="unknown (no index)", index_block=None, run=None)
    return AccountStatus(**(base | changes))


def test_hints_name_the_next_command_for_each_state():
    assert hints(_status()) == []
    assert "`krill worker stake`" in hints(_status(staked_as="nothing", staked=0, eligible=False))[0]
    low = hints(_status(staked=60 * TOKEN, eligible=False))[0]
    assert "minimum of 100 KRILL" in low and "--amount 40" in low
    assert "new account" in hints(_status(jailed=True, eligible=False))[0]
    assert "in 5 blocks" in hints(_status(unbonding=TOKEN, release_block=16))[0]
    assert "`krill worker withdraw`" in hints(_status(unbonding=TOKEN, release_block=11))[0]
    assert "`krill verifier claim`" in hints(_status(role="verifier", staked_as="verifier", claimable=TOKEN))[0]
    assert "`krill verifier status`" in hints(_status(staked_as="verifier"))[0]
