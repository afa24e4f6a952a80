"""Header: canonical bytes, signature, digest -> CID, strict schema."""

import hashlib
import json

import pytest
from nacl.signing import SigningKey
from payload_samples import KEY, LIMITS, header_body

from krill.payload import HeaderBody, SignedHeader, decode_header
from krill.payload.canonical import canonical_json, parse_canonical
from krill.payload.errors import (
    MalformedPayloadError,
    NonCanonicalError,
    PayloadTooLargeError,
    SchemaError,
    SignatureError,
    UnsupportedVersionError,
)
from krill.store.cid import digest_to_cid
from krill.store.local import LocalStore


def signed() -> SignedHeader:
    return HeaderBody(**header_body(), files={}).sign(KEY)


def test_canonical_encoding_is_fixed():
    assert canonical_json({"b": 1, "a": ["é", None, True]}) == '{"a":["é",null,true],"b":1}'.encode()
    with pytest.raises(SchemaError):
        canonical_json({"t": 0.7})
    with pytest.raises(NonCanonicalError):
        parse_canonical(b'{"b":1, "a":2}', 100)
    with pytest.raises(NonCanonicalError):
        parse_canonical(b'{"a":"\\u00e9"}', 100)
    with pytest.raises(SchemaError):
        parse_canonical(b'{"a":1,"a":1}', 100)
    with pytest.raises(SchemaError):
        parse_canonical(b'{"a":1.5}', 100)
    with pytest.raises(MalformedPayloadError):
        parse_canonical(b"[" * 100_000, 1 << 20)
    with pytest.raises(PayloadTooLargeError):
        parse_canonical(b"{}" + b" " * 200, 100)


def test_sign_verify_and_digest_locates_the_header(tmp_path):
    header = signed()
    data = header.encode()
    assert decode_header(data, LIMITS) == header
    assert header.digest == hashlib.sha256(data).digest()
    assert LocalStore(tmp_path).put_block(data) == digest_to_cid(header.digest) == header.cid
    # the signature covers sha256 of the header without its signature
    body = json.loads(data)
    del body["signature"]
    assert header.signing_digest() == hashlib.sha256(canonical_json(body)).digest()


def test_same_bytes_from_equal_inputs():
    assert signed().encode() == signed().encode()  # Ed25519 is deterministic, encoding canonical


def test_wrong_key_and_bad_signature():
    other = SigningKey(bytes(32))
    with pytest.raises(SignatureError):
        HeaderBody(**header_body(), files={}).sign(other)  # key differs from the header's ed25519_key
    forged = HeaderBody(**header_body(other), files={}).sign(other)
    forged = SignedHeader(**{**forged.model_dump(), "ed25519_key": bytes(KEY.verify_key).hex()})
    with pytest.raises(SignatureError, match="header.signature"):
        decode_header(forged.encode(), LIMITS)
    with pytest.raises(SignatureError, match="ed25519_key"):
        signed().verify(expected_key=bytes(other.verify_key))


@pytest.mark.parametrize("change,error,field", [
    ({"protocol": 2}, UnsupportedVersionError, "header.protocol"),
    ({"protocol": True}, SchemaError, "header.protocol"),
    ({"chain_id": "31337"}, SchemaError, "header.chain_id"),
    ({"chain_id": True}, SchemaError, "header.chain_id"),
    ({"contract": "0x" + "AB" * 20}, SchemaError, "header.contract"),
    ({"nonce": -1}, SchemaError, "header.nonce"),
    ({"nonce": 1 << 64}, SchemaError, "header.nonce"),
    ({"extra": 1}, SchemaError, "header.extra"),
    ({"sampling": {"temperature_milli": 1000, "max_new_tokens": 0, "seed": 1}}, SchemaError,
     "header.sampling.max_new_tokens"),
    ({"manifest_cid": "QmT78zSuBmuS4z925WZfrqQ1qHaJ56DQaTfyMUF7F8ff5o"}, SchemaError, "header.manifest_cid"),
    ({"files": {"../x": {"cid": "bafkreifjjcie6lypi6ny7amxnfftagclbuxndqonfipmb64f2km2devei4",
                         "sha256": "00" * 32, "size": 1}}}, SchemaError, "header.files"),
])
def test_schema_errors_name_the_field(change, error, field):
    raw = json.loads(signed().encode())
    raw.update(change)
    data = json.dumps(raw, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    with pytest.raises(error) as info:
        decode_header(data, LIMITS)
    assert info.value.field.startswith(field), info.value


def test_missing_field_and_size_cap():
    raw = json.loads(signed().encode())
    del raw["task"]
    with pytest.raises(SchemaError, match="header.task"):
        decode_header(canonical_json(raw), LIMITS)
    with pytest.raises(PayloadTooLargeError):
        decode_header(b"{" + b"x" * LIMITS.max_header_bytes, LIMITS)


def test_protocol_true_is_refused_by_name():
    raw = json.loads(signed().encode())
    raw["protocol"] = True  # True == 1, and Literal[1] alone accepts it even in strict mode
    with pytest.raises(SchemaError, match="boolean") as info:
        decode_header(canonical_json(raw), LIMITS, verify=False)
    assert info.value.field == "header.protocol"
    with pytest.raises(ValueError, match="boolean"):
        HeaderBody(**{**header_body(), "protocol": True}, files={})


def _drop(path):
    def change(raw):
        *parents, last = path
        for key in parents:
            raw = raw[key]
        del raw[last]
    return change


@pytest.mark.parametrize("change", [
    lambda raw: raw.update(protocol=True),
    _drop(["engine"]),
    _drop(["sampling", "top_k"]),
    _drop(["sampling", "top_p_milli"]),
], ids=["protocol-true", "engine-omitted", "top_k-omitted", "top_p-omitted"])
def test_a_signed_header_has_one_digest(change):
    """Which guarantee holds: decode_header accepts only bytes the header re-encodes to exactly, so
    `header.digest` is always sha256 of the bytes received (the digest committed on-chain)."""
    header = signed()
    data = header.encode()
    decoded = decode_header(data, LIMITS)
    assert decoded.encode() == data and decoded.digest == hashlib.sha256(data).digest()
    raw = json.loads(data)
    change(raw)
    other = canonical_json(raw)  # canonical JSON, a different digest, the same signed content
    assert other != data
    if raw["protocol"] is not True:
        SignedHeader.model_validate(raw).verify()  # the model fills the default back: the signature holds
    with pytest.raises((SchemaError, NonCanonicalError)) as info:
        decode_header(other, LIMITS)
    assert info.value.field in ("header", "header.protocol")


@pytest.mark.parametrize(("data", "field"), [
    pytest.param(b'{"protocol":1,"run_id":"\\ud800"}', "header.run_id", id="value"),
    pytest.param(b'{"\\udfff":1}', "header", id="key"),
])
def test_an_unpaired_surrogate_escape_is_a_schema_error_not_a_crash(data, field):
    """`\\ud800` parses to a str UTF-8 cannot encode: re-encoding it raised a bare UnicodeEncodeError,
    which no role's payload-fault handler caught (the indexer, verifier and coordinator stopped on it)."""
    with pytest.raises(SchemaError, match="unpaired UTF-16 surrogate") as info:
        decode_header(data, LIMITS)
    assert info.value.field == field
    with pytest.raises(SchemaError, match="unpaired UTF-16 surrogate"):
        canonical_json({"name": "\udc80"})
