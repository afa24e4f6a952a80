"""Why an untrusted payload was rejected: one `PayloadError` subclass per kind of failure.

Each carries `field` (what failed, e.g. `header.sampling.temperature_milli` or
`rollouts.token_ids`), so a coordinator or verifier can record the precise reason, and every
decoder in this package raises only these: malformed input never escapes as a KeyError,
struct.error or numpy exception.
"""

from __future__ import annotations

from krill.errors import PayloadError


class MalformedPayloadError(PayloadError):
    """Bytes that do not decode at all (bad UTF-8, JSON, safetensors framing)."""


class NonCanonicalError(PayloadError):
    """Decodable, but not the one canonical encoding: the digest would not be unique."""


class UnsupportedVersionError(PayloadError):
    """A protocol or format version this code does not speak."""


class SchemaError(PayloadError):
    """A field is missing, unknown, of the wrong type or out of range."""


class PayloadTooLargeError(PayloadError):
    """A payload or one of its parts exceeds a cap from the run configuration."""


class SignatureError(PayloadError):
    """The Ed25519 signature does not verify, or the key is not the one expected."""


class DigestMismatchError(PayloadError):
    """Bytes do not match the sha256, size or CID that the signed header names for them."""


class ContextMismatchError(PayloadError):
    """A valid header for another run, chain, contract, worker or model version."""


class DtypeError(PayloadError):
    """A tensor has a dtype other than the one its field requires."""


class ShapeError(PayloadError):
    """A tensor's shape or length disagrees with the manifest, the mask or its sibling fields."""


class NonFiniteError(PayloadError):
    """A NaN or an infinity where only finite numbers are allowed."""


class ValueRangeError(PayloadError):
    """A value outside its allowed range (token id past the vocabulary, positive log-prob, ...)."""


class OffsetsError(PayloadError):
    """Sequence offsets that are not a consistent partition of the token stream."""


def refield(exc: PayloadError, prefix: str) -> PayloadError:
    """The same error, its field placed under `prefix` (e.g. `sampling` -> `header.sampling`)."""
    reason = str(exc)[len(exc.field) + 2:] if exc.field else str(exc)
    field = f"{prefix}.{exc.field}" if exc.field else prefix
    return type(exc)(reason, field=field)
