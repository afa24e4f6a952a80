"""Which verdicts move a worker's trust (`krill.coordinator.standing`), over a small index in SQLite."""

from __future__ import annotations

import hashlib

import pytest

from krill.coordinator.standing import standings
from krill.db.models import ChainEventRow, Commit, Participant, Run, Verdict
from krill.db.session import open_database
from krill.protocol.selection import drawn

RUN = "ab" * 32
WORKER = "0x" + "11" * 20
PPM = 100_000  # p = 0.1
COMMIT_BLOCK = 100
RANDOMNESS = hashlib.sha256(b"hash of block 101").digest()


def _participant(address: str, role: int, key: str, block: int) -> Participant:
    return Participant(address=address, role=role, ed25519_key=key, staked=1, unbonding=0, release_block=0,
                       jailed=False, jailed_commit_id=None, slashed_total=0, first_block=block, commits=0,
                       checks_passed=0, checks_failed=0, trust_alpha=1.0, trust_beta=3.0, rewards_credited=0,
                       bounties_credited=0, claimed=0)


def _key(selected: bool, skip: int = 0) -> bytes:
    """The `skip`-th key the draw selects (or passes over) on commit 1."""
    keys = (hashlib.sha256(b"key %d" % i).digest() for i in range(10_000))
    return [k for k in keys if drawn(RANDOMNESS, 1, k, PPM) == selected][skip]


@pytest.fixture
def index(tmp_path):
    db = open_database(f"sqlite:///{tmp_path / 'index.db'}")
    serial = iter(range(1, 1 << 20))

    def tx() -> str:
        return f"0x{next(serial):064x}"

    with db.write() as s:
        s.add(Run(run_id=RUN, coordinator="0x" + "22" * 20, base_manifest_digest="00" * 32, max_staleness=2,
                  attestation_quorum=2, slash_fraction_bps=1000, verifier_bounty_bps=2000,
                  check_probability_ppm=PPM, challenge_window_blocks=50, reward_per_version=0, reward_pool=0,
                  funded_total=0, latest_version=0, created_block=1, created_tx=tx()))
        s.add(_participant(WORKER, 1, "33" * 32, 2))
        s.flush()
        s.add(Commit(commit_id=1, run_id=RUN, worker=WORKER, version=0, nonce=1, header_digest="44" * 32,
                     header_cid="x", worker_key="33" * 32, block_number=COMMIT_BLOCK, tx_hash=tx(),
                     randomness=RANDOMNESS.hex(), sealed_block=COMMIT_BLOCK + 2, pass_count=0, fail_count=0,
                     slashed=False))
    count = iter(range(0xa0, 0x100))

    def attest(key: bytes, staked_block: int, ok: bool) -> None:
        verifier = f"0x{next(count):040x}"
        with db.write() as s:
            s.add(_participant(verifier, 2, key.hex(), staked_block))
            s.add(ChainEventRow(tx_hash=tx(), log_index=0, block_number=staked_block, block_time=staked_block,
                                kind="Staked", run_id=None, commit_id=None, account=verifier, data={}))
            s.flush()
            s.add(Verdict(commit_id=1, verifier=verifier, ok=ok, evidence_digest="00" * 32, pass_count=0,
                          fail_count=0, block_number=COMMIT_BLOCK + 5, tx_hash=tx()))

    def counts(refuted: frozenset = frozenset()) -> tuple[int, int]:
        with db.session() as s:
            got = standings(s, RUN, {WORKER}, PPM, set(refuted))[WORKER]
        return got.passes, got.fails

    yield attest, counts
    db.close()


def test_only_selected_verifiers_count(index):
    attest, counts = index
    attest(_key(True), COMMIT_BLOCK - 10, ok=True)
    attest(_key(False), COMMIT_BLOCK - 10, ok=True)  # not drawn: a verdict anyone may give
    attest(_key(True, 1), COMMIT_BLOCK, ok=False)    # staked in the commit's own block: key fixed in time
    assert counts() == (1, 1)
    assert counts(frozenset({1})) == (1, 0)  # a refuted quorum's failures do not count


def test_a_key_staked_after_the_randomness_does_not_count(index):
    """The contract takes any 32 bytes as a key: an account staked once the commit's randomness is known can
    grind a key the draw selects (here the first of ~1/p tries), so its verdict must not move trust. Five such
    sybils on three commits lifted a worker from the prior 0.25 to 0.84."""
    attest, counts = index
    for n in range(3):
        attest(_key(True, n), COMMIT_BLOCK + 1 + n, ok=True)  # the randomness block and later
    assert counts() == (0, 0)
    attest(_key(True, 3), COMMIT_BLOCK - 1, ok=True)
    assert counts() == (1, 0)
