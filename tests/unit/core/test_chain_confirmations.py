"""`chain.confirmations` left unset: 0 on a local devnet, whose blocks are never reorganised, and a safe depth
on any other chain (the index and the verifiers do not detect a reorg of a block they already read)."""

from krill.config import DEVNET_CHAIN_IDS, LIVE_CONFIRMATIONS, ChainConfig


def test_unset_confirmations_depend_on_the_chain_and_a_set_value_always_wins():
    unset = ChainConfig()
    assert unset.confirmations is None
    assert [unset.confirmations_on(c) for c in (*DEVNET_CHAIN_IDS, 1, 8453, 11155111)] == \
        [0] * len(DEVNET_CHAIN_IDS) + [LIVE_CONFIRMATIONS] * 3
    assert LIVE_CONFIRMATIONS > 0
    for chosen in (0, 3):
        assert {ChainConfig(confirmations=chosen).confirmations_on(c) for c in (31337, 1)} == {chosen}


def test_a_role_that_knows_the_window_waits_at_most_an_eighth_of_it():
    unset = ChainConfig()
    assert [unset.confirmations_on(1, window) for window in (40, 80, 2000, 4)] == [5, 10, LIVE_CONFIRMATIONS, 1]
    assert unset.confirmations_on(31337, 40) == 0 and ChainConfig(confirmations=20).confirmations_on(1, 40) == 20
