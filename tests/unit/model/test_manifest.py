"""The manifest's canonical encoding and strict decoding."""

from __future__ import annotations

import hashlib
import json

import pytest

from krill.errors import PayloadError
from krill.model.manifest import Manifest, ParameterEntry, ShardEntry
from krill.store.cid import file_cid


def _manifest(**kw):
    data = b"shard"
    shard = ShardEntry(index=0, cid=file_cid(data), sha256=hashlib.sha256(data).hexdigest(), size=len(data),
                       parameters=[ParameterEntry(name="w", shape=[2, 3], dtype="F32")])
    args = {"version": 0, "architecture": {"rms_norm_eps": 1e-6, "hidden_size": 8, "name": "é"},
            "tokenizer": file_cid(b"tok"), "shards": [shard]}
    args.update(kw)
    return Manifest(**args)


def test_canonical_encoding_is_stable():
    m = _manifest()
    data = m.canonical_bytes()
    # Pinned: a change here changes every manifest CID.
    assert hashlib.sha256(data).hexdigest() == "cd104f02ffe62b01989b0f5d10277f5a6aca8266816b4193b7445b63cfe8c253"
    assert b" " not in data and "é".encode() in data
    assert data.startswith(b'{"architecture":{"hidden_size":8,"name":"\xc3\xa9","rms_norm_eps":1e-06}')
    again = Manifest.from_bytes(data)
    assert again == m and again.canonical_bytes() == data
    reordered = json.dumps(json.loads(data), indent=3).encode()
    assert Manifest.from_bytes(reordered).canonical_bytes() == data


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda d: d.update(extra=1), "extra"),
    (lambda d: d.update(schema_version=2), "schema_version"),
    (lambda d: d.update(version=-1), "version"),
    (lambda d: d.update(tokenizer="not-a-cid"), "tokenizer"),
    (lambda d: d.update(parent="Qm" + "1" * 44), "parent"),
    (lambda d: d["shards"][0].update(sha256="AB" * 32), "sha256"),
    (lambda d: d["shards"][0].update(index=1), "index"),
    (lambda d: d["shards"][0]["parameters"][0].update(dtype="F99"), "dtype"),
    (lambda d: d["shards"][0]["parameters"][0].update(shape=[-1]), "shape"),
    (lambda d: d["shards"][0]["parameters"].append(dict(d["shards"][0]["parameters"][0])), "more than one"),
    (lambda d: d.update(shards=[]), "shards"),
])
def test_strict_decoding_names_the_field(mutate, field):
    raw = json.loads(_manifest().canonical_bytes())
    mutate(raw)
    with pytest.raises(PayloadError, match=field):
        Manifest.from_bytes(json.dumps(raw).encode())


def test_rejects_non_json_and_oversize():
    with pytest.raises(PayloadError, match="manifest"):
        Manifest.from_bytes(b"\xff")
    with pytest.raises(PayloadError, match="exceeds"):
        Manifest.from_bytes(b" " * (16 * 1024 * 1024 + 1))
