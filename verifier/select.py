"""Which commits this verifier checks, and which gradient shard it recomputes.

Design decisions:
- Selection is the contract's public function `isCheckSelected(commit, verifier key)` over the
  sealed randomness blockhash(commit block + 1): the worker cannot know at commit time which of
  its commits will be checked, and anyone can audit that a verifier checked what it had to.
- The draw is computed here first, on the hash of block commit_block + 1 as the node reports it
  (`drawn`, the contract's formula), and the randomness is sealed only by a verifier the draw
  selects, the one that needs it on-chain (`sealRandomness` is idempotent); this module never
  mines (the loop does so only on devnets). With the default 10% check probability, sealing every
  commit had cost each verifier a transaction and three view calls per commit it then skipped
  (a third of a demo verifier's CPU). After sealing, `isCheckSelected` on the sealed value has
  the last word, so a reorganised block hash cannot make a verifier check what it need not.
  An unselected commit stays unsealed: its draw is public all the same, from the block hash.
- Only one shard's gradient is recomputed per check (the expensive part). It is drawn from
  H(randomness, commit id, verifier key), so it is deterministic and auditable, unknown to the
  worker at commit time, and different verifiers of one commit tend to cover different shards.
- The draw is not the only way in: a verifier also replays a commit another verifier failed
  (corroboration, `loop`), since a slash at quorum Q needs Q failing verdicts on one commit.
- Windows in blocks: an attestation counts while block <= commit_block + window. The verifier
  stops working on a commit once no transaction could still land in time, and declares a
  payload unavailable only in the last quarter of the window, so slow stores get every chance.
  A payload whose fetch is still running there (not found missing: slow) gets until the second
  half of that quarter (`still_fetching_until`): a verifier that first asks for it late (restarted
  after an outage, or corroborating a failing verdict attested late) used to attest an honest worker
  unavailable because one fetch took longer than a pass waits (2 s), while the half left still
  lets the attestation of a payload nobody serves land in the window. That half is never under
  `ATTEST_MARGIN` blocks where the window allows (as the margin of `unavailable_after` never is): on
  a window under 16 blocks it was one block (the head at the window's last block but one), so one
  block of delay between the decision and the transaction (a slow evidence upload, a busy node,
  other traffic) put the attestation past the window and a payload whose fetch never ended went
  unattested (`missed`); the price is a slow fetch given a block or two less on such windows (none
  over `unavailable_after` under 12 blocks).
"""

from __future__ import annotations

import hashlib

from krill.errors import ChainError
from krill.protocol.selection import drawn  # noqa: F401  (`select.drawn`: the verifier reads the draw here)

ZERO32 = b"\x00" * 32
# The fewest blocks `still_fetching_until` leaves before the window's last block, where the window allows:
# an attestation decided there still lands if one block passes before its transaction is sent.
ATTEST_MARGIN = 2


def last_block(commit_block: int, window: int) -> int:
    """The last block in which an attestation on the commit still counts."""
    return commit_block + window


def last_send_head(commit_block: int, window: int) -> int:
    """The last head at which a transaction sent (mined at head + 1 or later) can still land in the window."""
    return last_block(commit_block, window) - 1


def can_still_attest(head: int, commit_block: int, window: int) -> bool:
    """Whether a transaction sent now (mined at head + 1 or later) can still land in the window."""
    return head <= last_send_head(commit_block, window)


def unavailable_after(commit_block: int, window: int) -> int:
    """From this head on, a payload that still cannot be fetched is attested as unavailable."""
    margin = max(2, window // 4)
    return max(commit_block + 1, last_block(commit_block, window) - margin)


def still_fetching_until(commit_block: int, window: int) -> int:
    """From this head on, a payload whose fetch is still running (not known missing) is attested as
    unavailable: halfway through the margin `unavailable_after` leaves, and at least `ATTEST_MARGIN` blocks
    before the window's last block (never before `unavailable_after`)."""
    margin = max(2, window // 4)
    end = last_block(commit_block, window)
    return max(unavailable_after(commit_block, window), end - max(margin // 2, ATTEST_MARGIN))


def ensure_randomness(chain, commit_id: int, commit_block: int, head: int) -> bytes | None:
    """The commit's sealed randomness, sealing it if the block after the commit exists; None: not yet."""
    randomness = chain.randomness_of(commit_id)
    if randomness != ZERO32:
        return randomness
    if head <= commit_block + 1:
        return None
    try:
        chain.seal_randomness(commit_id)
    except ChainError:
        # Another party (a second verifier, say) sealed it between our read and our transaction,
        # which can change the gas our transaction needed; what counts is that it is sealed now.
        if chain.randomness_of(commit_id) == ZERO32:
            raise
    randomness = chain.randomness_of(commit_id)
    return randomness if randomness != ZERO32 else None


def block_randomness(chain, commit_block: int, head: int) -> bytes | None:
    """The randomness a seal of the commit records: the hash of block commit_block + 1, read from
    the node; None while that block does not exist."""
    if head < commit_block + 1:
        return None
    return chain.block_hash(commit_block + 1)


def is_selected(chain, commit_id: int, verifier_key: bytes) -> bool:
    """Whether this verifier (by its staked Ed25519 key) must check the commit."""
    return bool(chain.is_check_selected(commit_id, verifier_key))


def gradient_shard(randomness: bytes, commit_id: int, verifier_key: bytes, shards: list[int]) -> int | None:
    """The shard whose gradient is recomputed (among those the contribution carries); None if none."""
    if not shards:
        return None
    ordered = sorted(shards)
    draw = hashlib.sha256(b"krill/verify-shard/v1" + randomness + int(commit_id).to_bytes(32, "big")
                          + bytes(verifier_key)).digest()
    return ordered[int.from_bytes(draw, "big") % len(ordered)]
