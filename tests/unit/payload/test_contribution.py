"""Whole contributions: validation order, context checks, and tampering with every part."""

import json

import numpy as np
import pytest
from nacl.signing import SigningKey
from payload_samples import GRAD_LENGTHS, KEY, LIMITS, context, header_body, make_contribution

from krill.errors import PayloadError
from krill.payload import HeaderBody, validate_contribution
from krill.payload.canonical import canonical_json
from krill.payload.errors import ContextMismatchError, DigestMismatchError, SchemaError, SignatureError


def test_valid_contribution_round_trips():
    header, files = make_contribution()
    result = validate_contribution(header.encode(), files, LIMITS, context(digest=header.digest), GRAD_LENGTHS)
    assert result.header == header
    assert sorted(result.gradients) == [0, 1]
    assert result.rollouts.n_sequences == 8


@pytest.mark.parametrize("field,value", [
    ("run_id", "other-run"), ("chain_id", 1), ("contract", "0x" + "ef" * 20), ("worker", "0x" + "12" * 20),
    ("model_version", 6), ("manifest_cid", "bafkreifjjcie6lypi6ny7amxnfftagclbuxndqonfipmb64f2km2devei4"),
])
def test_context_mismatch(field, value):
    header, files = make_contribution()
    with pytest.raises(ContextMismatchError) as info:
        validate_contribution(header.encode(), files, LIMITS, context(**{field: value}), GRAD_LENGTHS)
    assert info.value.field == f"header.{field}"


def test_signed_with_another_key():
    header, files = make_contribution()
    other = SigningKey(bytes(31) + b"\x01")
    body = {**header.body().model_dump(), "ed25519_key": bytes(other.verify_key).hex()}
    resigned = HeaderBody(**body).sign(other)
    # the staked key is KEY: the forger's own key is refused even though its signature is valid
    with pytest.raises(SignatureError, match="ed25519_key"):
        validate_contribution(resigned.encode(), files, LIMITS, context(), GRAD_LENGTHS)
    # and a signature by another key under the staked key's name does not verify
    raw = json.loads(resigned.encode())
    raw["ed25519_key"] = bytes(KEY.verify_key).hex()
    with pytest.raises(SignatureError, match="header.signature"):
        validate_contribution(canonical_json(raw), files, LIMITS, context(), GRAD_LENGTHS)


def test_every_header_byte_is_protected():
    header, files = make_contribution()
    data = header.encode()
    for i in range(len(data)):
        for flip in (0x01, 0x20):
            tampered = bytearray(data)
            tampered[i] ^= flip
            with pytest.raises(PayloadError):
                validate_contribution(bytes(tampered), files, LIMITS, context(), GRAD_LENGTHS)
    # with the committed digest known, every change is caught before parsing
    with pytest.raises(DigestMismatchError):
        validate_contribution(data[:-1] + b" ", files, LIMITS, context(digest=header.digest), GRAD_LENGTHS)


@pytest.mark.parametrize("name", ["rollouts.safetensors", "grad-0.safetensors", "grad-1.safetensors"])
def test_every_file_byte_is_protected(name):
    header, files = make_contribution()
    data = files[name]
    positions = sorted(set(np.random.default_rng(0).integers(0, len(data), 300).tolist()) | {0, len(data) - 1})
    for i in positions:
        tampered = bytearray(data)
        tampered[i] ^= 0x01
        with pytest.raises(DigestMismatchError) as info:
            validate_contribution(header.encode(), {**files, name: bytes(tampered)}, LIMITS, context(), GRAD_LENGTHS)
        assert info.value.field.startswith(name)
    with pytest.raises(DigestMismatchError, match="size"):
        validate_contribution(header.encode(), {**files, name: data + b"\0"}, LIMITS, context(), GRAD_LENGTHS)


def test_files_must_match_the_manifest():
    header, files = make_contribution()
    with pytest.raises(SchemaError, match="grad-1.safetensors"):
        validate_contribution(header.encode(), files, LIMITS, context(), {0: GRAD_LENGTHS[0]})
    missing = dict(files)
    del missing["grad-0.safetensors"]
    with pytest.raises(SchemaError, match="grad-0.safetensors"):
        validate_contribution(header.encode(), missing, LIMITS, context(), GRAD_LENGTHS)
    body = header_body()
    no_rollouts = HeaderBody(**body, files={}).sign(KEY)
    with pytest.raises(SchemaError, match="rollouts"):
        validate_contribution(no_rollouts.encode(), files, LIMITS, context(), GRAD_LENGTHS)
