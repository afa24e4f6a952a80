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
    # the index stores sizes and element counts in signed 64-bit columns
    (lambda d: d["shards"][0].update(size=2**63), "manifest.shards.0.size"),
    (lambda d: d["shards"][0]["parameters"][0].update(shape=[2**63]), "manifest.shards.0.parameters.0.shape"),
    (lambda d: d["shards"][0]["parameters"][0].update(shape=[2**32, 2**31]), "manifest.shards.0.parameters.0.shape"),
    (lambda d: d["shards"][0]["parameters"].append(dict(name="b", shape=[2**63 - 6], dtype="F32")),
     "manifest.shards.0.parameters: .*elements"),
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


def test_counts_up_to_the_int64_bound_are_accepted():
    raw = json.loads(_manifest().canonical_bytes())
    raw["shards"][0].update(size=2**63 - 1)
    raw["shards"][0]["parameters"].append(dict(name="b", shape=[2**63 - 7], dtype="F32"))  # 6 + this = 2**63 - 1
    m = Manifest.from_bytes(json.dumps(raw).encode())
    assert m.shards[0].size == 2**63 - 1
    assert m.shards[0].elements == 2**63 - 1 and m.shards[0].parameters[0].elements == 6


def test_json_the_parser_cannot_take_is_a_payload_error():
    """Bombs are refused before `json` recurses (with web3 imported the recursion limit is 100000,
    and a 100000-deep array overflowed the C stack: a segfault, not a RecursionError)."""
    with pytest.raises(PayloadError, match="manifest: nesting deeper than 32"):
        Manifest.from_bytes(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(PayloadError, match="manifest: not JSON .*4300 digits"):
        Manifest.from_bytes(b'{"version":' + b"1" * 5000 + b"}")
    text = _manifest(architecture={"rope_theta": 1.5}).canonical_bytes()
    for constant in (b"NaN", b"Infinity", b"-Infinity"):
        with pytest.raises(PayloadError, match=f"manifest: not JSON .*{constant.decode()} is not a JSON number"):
            Manifest.from_bytes(text.replace(b"1.5", constant))
    deep_config = _manifest(architecture={"text_config": {"rope_scaling": {"factor": 8}}})
    assert Manifest.from_bytes(deep_config.canonical_bytes()) == deep_config
