"""What the explorer reads from the content store: aggregation records, evidence, signed headers.

Design decisions:
- The store is optional and untrusted: every object is fetched by a CID that follows from an
  on-chain digest, so the store's own verification makes a wrong answer impossible to show; a
  missing or unreachable object (or no store configured) is shown as "unavailable: why", never
  as an error page. That is the one place the explorer tolerates a fault, and it says what was
  lost.
- Evidence documents belong to the verifier role, which the explorer may not import: they are
  read here as what they are on the wire, canonical JSON of a versioned format, checked for
  their format tag and shape, and rendered generically (every check with its figures).
- A header's signature is re-verified on each view against the Ed25519 key the worker staked
  (as indexed from the chain), in addition to the indexer's verdict recorded at ingest.
"""

from __future__ import annotations

from typing import Any

from krill.errors import KrillError

EVIDENCE_FORMAT = "krill-evidence/1"
MAX_EVIDENCE_BYTES = 1 << 20
STORE_FAULTS = (KrillError, ConnectionError, TimeoutError, OSError)


def _unavailable(cid: str | None, why: str) -> dict[str, Any]:
    return {"available": False, "cid": cid, "error": why}


def _why(exc: BaseException) -> str:
    message = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
    return f"{type(exc).__name__}: {message}"[:500]


def record_view(store, record_digest: str | None) -> dict[str, Any]:
    """The aggregation record of a version (what was folded, weights, trimmed fractions)."""
    from krill.protocol.record import load_record
    from krill.store.cid import digest_to_cid

    if record_digest is None:
        return _unavailable(None, "version 0 (the base model) has no aggregation record")
    cid = digest_to_cid(bytes.fromhex(record_digest))
    if store is None:
        return _unavailable(cid, "no content store configured for this explorer")
    try:
        record = load_record(store, bytes.fromhex(record_digest))
    except STORE_FAULTS as exc:
        return _unavailable(cid, _why(exc))
    return {"available": True, "cid": cid, "error": None, "record": record.model_dump(mode="json")}


# What the evidence page reads, with the JSON kinds it can render: (key, kinds, what the error says).
_EVIDENCE_FIELDS = (("ok", (bool,), "a boolean"), ("reason", (str,), "a string"),
                    ("failed_field", (str, type(None)), "a string or null"))
_CHECK_FIELDS = (("name", (str,), "a string"), ("ok", (bool,), "a boolean"), ("detail", (str,), "a string"),
                 ("ms", (int,), "an integer"), ("figures", (dict, type(None)), "an object or null"))


def _evidence_shape(doc: Any) -> str | None:
    if not isinstance(doc, dict):
        return "not a JSON object"
    if doc.get("format") != EVIDENCE_FORMAT:
        return f"format {str(doc.get('format'))[:40]!r}, expected {EVIDENCE_FORMAT!r}"
    problem = _fields_problem(doc, _EVIDENCE_FIELDS, lambda key: repr(key))
    if problem:
        return problem
    checks = doc.get("checks")
    if not isinstance(checks, list):
        return f"'checks' is {_kind(checks) if 'checks' in doc else 'missing'}, expected a list of objects"
    for i, check in enumerate(checks):
        if not isinstance(check, dict):
            return f"checks[{i}] is {_kind(check)}, expected an object"
        problem = _fields_problem(check, _CHECK_FIELDS, lambda key, i=i: f"checks[{i}].{key}")
        if problem:
            return problem
        bad = [k for k, v in (check.get("figures") or {}).items() if not _is(v, (str, int, bool, type(None)))]
        if bad:
            return f"checks[{i}].figures[{str(bad[0])[:40]!r}] is not a string, integer, boolean or null"
    return None


def _fields_problem(obj: dict, fields, name) -> str | None:
    """The first of `fields` (key, kinds, what) that `obj` lacks or holds in another kind; `name(key)`
    spells the key in the message. A field whose `what` ends with "or null" may be absent."""
    for key, kinds, what in fields:
        if key not in obj and what.endswith("or null"):
            continue
        if not _is(obj.get(key), kinds):
            return f"{name(key)} is {_kind(obj.get(key)) if key in obj else 'missing'}, expected {what}"
    return None


def _is(value: Any, kinds: tuple[type, ...]) -> bool:
    """isinstance, except that a boolean is not an integer here (JSON tells them apart)."""
    if isinstance(value, bool):
        return bool in kinds
    return isinstance(value, kinds)


def _kind(value: Any) -> str:
    return "null" if value is None else {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
                                         int: "an integer"}.get(type(value), type(value).__name__)


def evidence_view(store, evidence_digest: str) -> dict[str, Any]:
    """The evidence document a verdict attested (its sha256 is the on-chain evidence digest)."""
    from krill.payload.canonical import parse_canonical
    from krill.store.cid import digest_to_cid

    cid = digest_to_cid(bytes.fromhex(evidence_digest))
    if store is None:
        return _unavailable(cid, "no content store configured for this explorer")
    try:
        doc = parse_canonical(store.get(cid, max_bytes=MAX_EVIDENCE_BYTES), MAX_EVIDENCE_BYTES, field="evidence")
    except STORE_FAULTS as exc:
        return _unavailable(cid, _why(exc))
    problem = _evidence_shape(doc)
    if problem is not None:
        return _unavailable(cid, f"not an evidence document: {problem}")
    return {"available": True, "cid": cid, "error": None, "document": doc}


def header_view(store, header_cid: str, staked_key: str | None) -> dict[str, Any]:
    """The signed header of a commit and whether its signature verifies against the staked key now."""
    from krill.db.content import HEADER_LIMITS
    from krill.payload.header import decode_header

    if store is None:
        return _unavailable(header_cid, "no content store configured for this explorer")
    try:
        data = store.get(header_cid, max_bytes=HEADER_LIMITS.max_header_bytes)
        header = decode_header(data, HEADER_LIMITS, verify=False)
    except STORE_FAULTS as exc:
        return _unavailable(header_cid, _why(exc))
    try:
        header.verify(expected_key=staked_key)
        signature = {"valid": True, "detail": "Ed25519 signature verifies"
                     + (" with the key staked on-chain" if staked_key else " (no staked key indexed to compare)")}
    except KrillError as exc:
        signature = {"valid": False, "detail": str(exc)[:500]}
    body = header.to_json()
    return {"available": True, "cid": header_cid, "error": None, "signature": signature,
            "header": {k: body[k] for k in sorted(body) if k != "signature"}, "signature_hex": header.signature}
