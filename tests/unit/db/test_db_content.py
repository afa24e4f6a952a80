"""Manifest fetching through the indexer on SQLite: malformed manifests end INVALID, the rest are indexed."""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace

import pytest
from sqlalchemy import select

from krill.db.indexer import Indexer, SyncReport
from krill.db.ingest import _version_row
from krill.db.models import FetchStatus, Run, Shard, Version
from krill.db.session import open_database
from krill.model.manifest import Manifest, ParameterEntry, ShardEntry
from krill.store.cid import file_cid
from krill.store.local import LocalStore

RUN = "11" * 32


def _good(version: int) -> bytes:
    shard = ShardEntry(index=0, cid=file_cid(b"shard"), sha256=hashlib.sha256(b"shard").hexdigest(), size=5,
                       parameters=[ParameterEntry(name="w", shape=[2, 3], dtype="F32"),
                                   ParameterEntry(name="b", shape=[3], dtype="F32")])
    return Manifest(version=version, architecture={"model_type": "llama"}, tokenizer=file_cid(b"tok"),
                    shards=[shard]).canonical_bytes()


def _mutated(version: int, mutate) -> bytes:
    raw = json.loads(_good(version))
    mutate(raw["shards"][0])
    return json.dumps(raw).encode()


# version -> (manifest bytes, what the recorded error names); None: a well-formed manifest
MANIFESTS = {
    0: (_good(0), None),
    1: (_mutated(1, lambda s: s.update(size=2**64)), "manifest.shards.0.size"),
    2: (_mutated(2, lambda s: s["parameters"][0].update(shape=[2**63])), "manifest.shards.0.parameters.0.shape"),
    3: (_mutated(3, lambda s: s["parameters"][0].update(shape=[2**32, 2**32])), "manifest.shards.0.parameters.0.shape"),
    4: (_mutated(4, lambda s: s.update(parameters=[dict(name="a", shape=[2**62], dtype="F32"),
                                                   dict(name="b", shape=[2**62], dtype="F32")])),
        "manifest.shards.0.parameters"),
    5: (b"[" * 100_000 + b"]" * 100_000, "nesting deeper than"),
    6: (_good(6).replace(b'"version":6', b'"version":' + b"6" * 5000), "4300 digits"),
    7: (_good(7), None),
}


@pytest.fixture
def world(tmp_path):
    store = LocalStore(tmp_path / "store")
    db = open_database(f"sqlite:///{tmp_path / 'index.db'}")
    with db.write() as s:
        s.add(Run(run_id=RUN, coordinator="0x" + "22" * 20, base_manifest_digest="00" * 32, max_staleness=1,
                  attestation_quorum=1, slash_fraction_bps=1, verifier_bounty_bps=1, check_probability_ppm=1,
                  challenge_window_blocks=1, reward_per_version=1, reward_pool=0, funded_total=0, latest_version=0,
                  created_block=1, created_tx="0x" + "33" * 32))
        for version, (data, _) in MANIFESTS.items():
            store.put_block(data)
            s.add(_version_row(RUN, version, hashlib.sha256(data).digest(), None, 1 + version,
                               "0x" + f"{version:064x}", settled=False))
    # Content fetching needs the chain only for its id and contract address; no events are read.
    w3 = SimpleNamespace(eth=SimpleNamespace(chain_id=31337), provider=SimpleNamespace(endpoint_uri="fake"))
    chain = SimpleNamespace(address="0x" + "44" * 20, w3=w3)
    yield Indexer(chain, db, store, fetch_batch=64), db
    db.close()


def test_malformed_manifests_end_invalid_and_the_rest_of_the_batch_is_indexed(world):
    ix, db = world
    report = SyncReport(0, 0, 0)
    ix.fetch_content(report)
    assert report.fetched == {"manifests_available": 2, "manifests_invalid": 6}
    with db.session() as s:
        rows = {v.version: v for v in s.scalars(select(Version))}
        shards = {(sh.version, sh.shard): (sh.size, sh.parameters, sh.elements) for sh in s.scalars(select(Shard))}
    for version, (_, named) in MANIFESTS.items():
        row = rows[version]
        assert row.manifest_attempts == 1, version
        if named is None:
            assert (row.manifest_status, row.manifest_error, row.num_shards) == (FetchStatus.AVAILABLE, None, 1)
        else:
            assert row.manifest_status == FetchStatus.INVALID, version
            assert "PayloadError: manifest" in row.manifest_error and named in row.manifest_error, row.manifest_error
    assert shards == {(0, 0): (5, 2, 9), (7, 0): (5, 2, 9)}
    # INVALID is final: a later pass (or a restarted indexer) has nothing left to fetch and does not crash.
    again = SyncReport(0, 0, 0)
    ix.fetch_content(again)
    assert again.fetched == {}
