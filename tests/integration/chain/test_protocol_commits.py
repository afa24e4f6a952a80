"""KrillProtocol commitments, check randomness, attestations and slashing, on py-evm and on Anvil."""

from __future__ import annotations

import pytest
from chain_constants import CHALLENGE_WINDOW, MIN_WORKER, RUN_ID, WIDE_RUN, digest, key_of
from eth_abi import encode
from web3 import Web3

from krill.chain import errors as E
from krill.chain.events import (
    Attested,
    BountyCredited,
    Committed,
    RandomnessSealed,
)
from krill.chain.types import Role
from krill.verifier.select import drawn


def _commit(env, worker: int, label: str, version: int = 0, nonce: int = 0) -> int:
    return env.at(worker).commit(RUN_ID, version, nonce, digest(label)).event(Committed).commit_id


def _publish(env, upto: int) -> None:
    latest = env.coordinator.run_of(RUN_ID).latest_version
    for v in range(latest + 1, upto + 1):
        env.coordinator.publish_version(RUN_ID, v, digest(f"manifest-{v}"), digest(f"record-{v}"))


def test_commit_records_and_emits(staked):
    env = staked
    receipt = env.at(2).commit(RUN_ID, 0, 7, digest("h"))
    event = receipt.event(Committed)
    assert (event.commit_id, event.run_id, event.worker, event.version, event.nonce, event.header_digest) == (
        1, RUN_ID, env.addr(2), 0, 7, digest("h"))
    info = env.admin.commit_of(1)
    assert (info.worker, info.commit_block, info.pass_count, info.fail_count, info.slashed) == (
        env.addr(2), receipt.block_number, 0, 0, False)
    assert env.admin.commit_count() == 1
    assert env.admin.commit_id_of(RUN_ID, env.addr(2), 0, 7) == 1
    assert env.admin.commit_id_by_digest(digest("h")) == 1
    assert env.admin.commit_of(2).worker == "0x" + "0" * 40


def test_the_largest_uint64_nonce_round_trips(staked):
    """Nonces are uint64 end to end: the largest one commits, is found again by its key and decodes unchanged."""
    env = staked
    top = 2**64 - 1
    event = env.at(2).commit(RUN_ID, 0, top, digest("top nonce")).event(Committed)
    assert event.nonce == top
    assert env.admin.commit_of(event.commit_id).nonce == top
    assert env.admin.commit_id_of(RUN_ID, env.addr(2), 0, top) == event.commit_id
    assert env.admin.commit_id_of(RUN_ID, env.addr(2), 0, top - 1) == 0


def test_commit_rejects_future_and_stale_versions(staked):
    env = staked
    _publish(env, 3)
    with pytest.raises(E.CommitVersionFromFuture) as err:
        _commit(env, 2, "a", version=4)
    assert err.value.revert_args == (4, 3)
    with pytest.raises(E.CommitVersionTooStale) as err:
        _commit(env, 2, "a", version=0)
    assert err.value.revert_args == (0, 3, 2)
    assert _commit(env, 2, "a", version=1) == 1  # latest - maxStaleness is still accepted
    assert _commit(env, 2, "b", version=3) == 2


def test_commit_rejects_replays_and_copycats(staked):
    env = staked
    first = _commit(env, 2, "original", nonce=1)
    with pytest.raises(E.CommitDuplicate) as err:
        _commit(env, 2, "another", nonce=1)
    assert err.value.revert_args == (RUN_ID, env.addr(2), 0, 1, first)
    with pytest.raises(E.CommitDigestTaken) as err:
        _commit(env, 3, "original", nonce=1)
    assert err.value.revert_args == (digest("original"), first)
    with pytest.raises(E.CommitZeroDigest):
        env.at(2).commit(RUN_ID, 0, 2, b"\x00" * 32)
    with pytest.raises(E.RunUnknown) as err:
        env.at(2).commit(digest("no run"), 0, 2, digest("x"))
    assert err.value.revert_args == (digest("no run"),)


def test_only_eligible_workers_commit(staked):
    env = staked
    with pytest.raises(E.StakeNotEligible) as err:
        _commit(env, 5, "verifier")
    assert err.value.revert_args == (env.addr(5), Role.WORKER)
    with pytest.raises(E.StakeNotEligible):
        _commit(env, env.OUTSIDER, "outsider")
    env.at(3).request_unstake(MIN_WORKER + 1)  # below the minimum now
    with pytest.raises(E.StakeNotEligible):
        _commit(env, 3, "unbonded")


def test_randomness_is_the_next_block_hash_sealed_once(staked):
    env = staked
    cid = _commit(env, 2, "h")
    block = env.admin.commit_of(cid).commit_block
    with pytest.raises(E.RandomnessNotSealed) as err:
        env.admin.is_check_selected(cid, key_of(5))
    assert err.value.revert_args == (cid,)
    if env.block() <= block + 1:
        with pytest.raises(E.RandomnessNotYetAvailable) as err:
            env.at(5).seal_randomness(cid)
        assert err.value.revert_args[:2] == (cid, block + 1)
    env.mine(1)
    receipt = env.at(env.OUTSIDER).seal_randomness(cid)
    sealed = receipt.event(RandomnessSealed).randomness
    assert sealed == bytes(env.w3.eth.get_block(block + 1)["hash"])
    assert env.admin.randomness_of(cid) == sealed
    assert env.at(5).seal_randomness(cid).events_of(RandomnessSealed) == []  # idempotent
    assert env.at(5).seal_randomness_now(cid) == sealed
    draw = int.from_bytes(Web3.keccak(encode(["bytes32", "uint256", "bytes32"], [sealed, cid, key_of(5)])), "big")
    assert env.admin.is_check_selected(cid, key_of(5)) == (draw % 1_000_000 < env.params.check_probability_ppm)
    # The verifier's own draw (computed before any seal, on the block hash) agrees with the contract.
    assert env.admin.block_hash(block + 1) == sealed
    keys = [key_of(i) for i in range(40)]
    chosen = [env.admin.is_check_selected(cid, k) for k in keys]
    assert 0 < sum(chosen) < len(keys)  # both outcomes occur at the 50% test probability
    assert chosen == [drawn(sealed, cid, k, env.params.check_probability_ppm) for k in keys]
    with pytest.raises(E.CommitUnknown) as err:
        env.admin.seal_randomness(99)
    assert err.value.revert_args == (99,)


def test_seal_randomness_now_mines_the_block_on_devnets(staked):
    env = staked
    cid = _commit(env, 2, "h")
    sealed = env.at(2).seal_randomness_now(cid)
    assert sealed != b"\x00" * 32 and env.admin.randomness_of(cid) == sealed


def test_randomness_expires_after_256_blocks(staked):
    env = staked
    cid = _commit(env, 2, "h")
    target = env.admin.commit_of(cid).commit_block + 1
    env.mine(257)
    with pytest.raises(E.RandomnessExpired) as err:
        env.admin.seal_randomness(cid)
    assert err.value.revert_args == (cid, target)


def test_attest_counts_verdicts_once_per_verifier(staked):
    env = staked
    cid = _commit(env, 2, "h")
    e = env.at(5).attest(cid, True, digest("ev5")).event(Attested)
    assert (e.verifier, e.ok, e.evidence_digest, e.pass_count, e.fail_count) == (env.addr(5), True, digest("ev5"), 1, 0)
    e = env.at(6).attest(cid, False, digest("ev6")).event(Attested)
    assert (e.pass_count, e.fail_count) == (1, 1)
    with pytest.raises(E.AttestationDuplicate) as err:
        env.at(5).attest(cid, False, digest("again"))
    assert err.value.revert_args == (cid, env.addr(5))
    a = env.admin.attestation_of(cid, env.addr(6))
    assert (a.exists, a.ok, a.evidence_digest) == (True, False, digest("ev6"))
    assert not env.admin.attestation_of(cid, env.addr(7)).exists
    assert env.admin.failing_verifiers_of(cid) == [env.addr(6)]
    info = env.admin.commit_of(cid)
    assert (info.pass_count, info.fail_count) == (1, 1)
    with pytest.raises(E.StakeNotEligible) as err:
        env.at(3).attest(cid, False, digest("worker"))
    assert err.value.revert_args == (env.addr(3), Role.VERIFIER)
    with pytest.raises(E.CommitUnknown):
        env.at(5).attest(99, True, digest("x"))


def test_attest_only_inside_the_challenge_window(staked):
    env = staked
    cid = _commit(env, 2, "h")
    last = env.admin.commit_of(cid).commit_block + CHALLENGE_WINDOW
    env.mine(last - 1 - env.block())
    assert env.at(5).attest(cid, False, digest("in time")).block_number == last
    with pytest.raises(E.AttestationWindowClosed) as err:
        env.at(6).attest(cid, False, digest("late"))
    assert err.value.revert_args == (cid, last, last + 1)


@pytest.mark.slow
def test_failing_attestations_per_commit_are_capped(crowd, staked):
    """The failing cap bounds slash's bounty loop; a full failing list still leaves room for passes."""
    env = staked
    cid = env.at(2).commit(WIDE_RUN, 0, 0, digest("capped")).event(Committed).commit_id
    for verifier in crowd[:32]:
        verifier.attest(cid, False, digest(verifier.sender))
    with pytest.raises(E.AttestationLimitReached) as err:
        crowd[32].attest(cid, False, digest("one too many"))
    assert err.value.revert_args == (cid, False, 32)
    assert crowd[32].attest(cid, True, digest("a pass still lands")).event(Attested).pass_count == 1
    assert len(env.admin.failing_verifiers_of(cid)) == 32
    receipt = env.coordinator.slash(cid)
    assert len(receipt.events_of(BountyCredited)) == 32
    assert receipt.gas_used < 1_500_000  # the worst case of the loop, far below a block
