"""The index (and the explorer) serve every run, so they check headers against the widest caps any run spec
may set: with the default caps, a run allowing 301 files had every honest header marked invalid, for good."""

from __future__ import annotations

import hashlib

from nacl.signing import SigningKey

from krill.db.content import HEADER_LIMITS, CommitFacts, fetch_header
from krill.db.models import FetchStatus
from krill.payload.header import HeaderBody, decode_header
from krill.payload.limits import PayloadLimits
from krill.store.cid import digest_to_cid, file_cid

KEY = SigningKey(bytes(range(32)))
RUN, CONTRACT, WORKER = "11" * 32, "0x" + "cc" * 20, "0x" + "ab" * 20


def _header(shards: int, extra: tuple[str, ...] = ()) -> bytes:
    files = {f"grad-{s}.safetensors": {"cid": file_cid(s.to_bytes(2, "big")), "sha256": "00" * 32, "size": 10}
             for s in range(shards)}
    files.update({name: {"cid": file_cid(name.encode()), "sha256": "00" * 32, "size": 10} for name in extra})
    files["rollouts.safetensors"] = {"cid": file_cid(b"r"), "sha256": "00" * 32, "size": 10}
    body = HeaderBody(run_id=RUN, chain_id=31337, contract=CONTRACT, worker=WORKER,
                      ed25519_key=bytes(KEY.verify_key).hex(), model_version=3, behaviour_version=3,
                      manifest_cid=file_cid(b"m"), task="arith", prompt_seed=1, nonce=0,
                      sampling={"temperature_milli": 1000, "top_p_milli": 1000, "top_k": 0, "max_new_tokens": 5,
                                "seed": 42}, files=files)
    return body.sign(KEY).encode()


def test_a_header_a_runs_own_wider_limits_allow_is_indexed_valid():
    data = _header(300)
    decode_header(data, PayloadLimits(vocab_size=64, max_files=512, max_header_bytes=256 * 1024))  # the run's
    facts = CommitFacts(commit_id=1, header_cid=digest_to_cid(hashlib.sha256(data).digest()), run_id=RUN,
                        worker=WORKER, version=3, nonce=0, worker_key=bytes(KEY.verify_key).hex(), chain_id=31337,
                        contract=CONTRACT)
    fetched = fetch_header(type("Store", (), {"get": lambda self, cid, max_bytes=None: data})(), facts)
    assert fetched.status == FetchStatus.AVAILABLE, fetched.error


def test_the_index_caps_are_the_widest_a_spec_allows():
    widest = {name: PayloadLimits.model_fields[name].metadata for name in ("max_header_bytes", "max_files")}
    assert HEADER_LIMITS.max_header_bytes == next(m.le for m in widest["max_header_bytes"] if hasattr(m, "le"))
    assert HEADER_LIMITS.max_files == next(m.le for m in widest["max_files"] if hasattr(m, "le"))


def test_a_shard_named_twice_is_indexed_once():
    """`grad-00.safetensors` beside `grad-0.safetensors` made the index list shard 0 twice."""
    data = _header(2, extra=("grad-00.safetensors", "grad-01.safetensors"))
    facts = CommitFacts(commit_id=1, header_cid=digest_to_cid(hashlib.sha256(data).digest()), run_id=RUN,
                        worker=WORKER, version=3, nonce=0, worker_key=bytes(KEY.verify_key).hex(), chain_id=31337,
                        contract=CONTRACT)
    fetched = fetch_header(type("Store", (), {"get": lambda self, cid, max_bytes=None: data})(), facts)
    assert fetched.status == FetchStatus.AVAILABLE, fetched.error
    assert fetched.values["shards"] == [0, 1]
