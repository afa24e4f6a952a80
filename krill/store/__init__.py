"""Content-addressed storage: IPFS CIDs computed as Kubo computes them, and the stores behind them.

`krill.store.cid` names content; `krill.store.base.open_store(config)` opens the configured store
(`local`, `kubo` or `embedded-kubo`). Every store verifies what it returns against the CID asked
for: no store is trusted.
"""

from krill.store.cid import (
    CHUNK_SIZE,
    MAX_BLOCK_SIZE,
    MAX_LINKS,
    InvalidCIDError,
    cid_to_digest,
    digest_to_cid,
    file_cid,
    normalize_cid,
    parse_cid,
    raw_block_cid,
    verify_block,
)

__all__ = [
    "CHUNK_SIZE", "MAX_BLOCK_SIZE", "MAX_LINKS", "InvalidCIDError", "cid_to_digest", "digest_to_cid",
    "file_cid", "normalize_cid", "parse_cid", "raw_block_cid", "verify_block",
]
