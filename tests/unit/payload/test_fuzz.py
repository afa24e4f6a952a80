"""Fuzzing the decoders of untrusted bytes with hypothesis.

Malformed input must raise `PayloadError` (store decoders: `IntegrityError`), never anything else,
never hang and never allocate past the caps. The normal suite runs about 12,000 generated inputs
with a fixed seed (`derandomize`); `pytest -m fuzz_long` runs twenty times as many.
"""

import json
import struct
import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from payload_samples import GRAD_LENGTHS, LIMITS, make_contribution

from krill.errors import IntegrityError, PayloadError
from krill.payload import decode_gradient_shard, decode_header, decode_rollouts
from krill.payload.canonical import parse_canonical
from krill.payload.tensors import parse_safetensors
from krill.store.unixfs import build_file_dag, decode_dag_pb, decode_unixfs

HEADER, FILES = make_contribution(seed=11, codec="fp16")
HEADER_BYTES = HEADER.encode()
ROLLOUTS = FILES["rollouts.safetensors"]
GRADS = {codec: make_contribution(seed=12, codec=codec)[1]["grad-1.safetensors"]
         for codec in ("fp32", "fp16", "bf16", "int8-block")}
DAG_NODE = list(build_file_dag(bytes(600_000)))[-1][1]
MAX_SECONDS = 2.0


def _expect(decode, data, errors=(PayloadError,)):
    # The decoder's own CPU time (this thread's), not the wall clock: a loaded machine that descheduled the
    # test for a moment failed a header decode as "too long" at 2.1 s of wall time. A decoder that loops or
    # does work out of proportion to its input still spends the CPU time.
    start = time.thread_time()
    try:
        decode(data)
    except errors:
        pass
    assert time.thread_time() - start < MAX_SECONDS, "decoder took too long"


@st.composite
def mutated(draw, base: bytes):
    """A valid payload with a few byte flips, insertions, deletions or a truncation."""
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and data:
            data[pos] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete" and data:
            del data[pos:pos + draw(st.integers(1, 8))]
        elif kind == "truncate":
            del data[pos:]
    return bytes(data)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.text(max_size=20)
    | st.floats(allow_nan=True, allow_infinity=True),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)


@st.composite
def header_field_swaps(draw):
    raw = json.loads(HEADER_BYTES)
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(sorted(raw) + ["sampling.seed", "files", "new_field"]))
        value = draw(json_values)
        if key.startswith("sampling.") and isinstance(raw["sampling"], dict):
            raw["sampling"][key.split(".")[1]] = value
        else:
            raw[key] = value
    return json.dumps(raw, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


dtypes = st.sampled_from(["F32", "F16", "BF16", "I8", "U8", "I32", "I64", "F64", "BOOL", "", 3])


@st.composite
def safetensors_files(draw):
    """Structurally plausible safetensors with adversarial headers (names, dtypes, shapes, offsets)."""
    names = list(GRAD_LENGTHS[1]) + ["lm_head.weight::scale", "x"]
    header: dict = {"__metadata__": draw(st.sampled_from([
        {"format": "krill-grad", "version": "1", "shard": "1", "codec": c, "block_size": b}
        for c in ("fp32", "fp16", "bf16", "int8-block", "zip") for b in ("32", "0", "1e3")]))}
    position = 0
    for name in draw(st.lists(st.sampled_from(names), max_size=4, unique=True)):
        shape = draw(st.lists(st.integers(0, 1 << 41), max_size=3) | st.just([GRAD_LENGTHS[1].get(name, 3)]))
        size = draw(st.integers(0, 400))
        begin = draw(st.sampled_from([position, max(position - 1, 0), position + 1]))
        header[name] = {"dtype": draw(dtypes), "shape": shape, "data_offsets": [begin, begin + size]}
        position = begin + size
    text = json.dumps(header).encode()
    declared = draw(st.sampled_from([len(text), len(text) + 1, 1 << 63, 0]))
    return struct.pack("<Q", declared) + text + draw(st.binary(min_size=0, max_size=1200))


def _fuzz(strategy, decode, n, errors=(PayloadError,), long=False):
    @settings(max_examples=n * (20 if long else 1), derandomize=True, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
    @given(strategy)
    def run(data):
        _expect(decode, data, errors)

    return run


def _grad(data):
    return decode_gradient_shard(data, GRAD_LENGTHS[1], LIMITS, 1)


def _dag(data):
    links, payload = decode_dag_pb(data)
    if payload is not None:
        decode_unixfs(payload)


CASES = {
    "header_random_bytes": (st.binary(max_size=2000), lambda d: decode_header(d, LIMITS), 1500, (PayloadError,)),
    "header_mutated": (mutated(HEADER_BYTES), lambda d: decode_header(d, LIMITS), 2000, (PayloadError,)),
    "header_field_swaps": (header_field_swaps(), lambda d: decode_header(d, LIMITS), 1500, (PayloadError,)),
    "canonical_json_text": (st.text(max_size=200).map(str.encode), lambda d: parse_canonical(d, 4096), 1000,
                            (PayloadError,)),
    "rollouts_random_bytes": (st.binary(max_size=2000), lambda d: decode_rollouts(d, LIMITS), 800, (PayloadError,)),
    "rollouts_mutated": (mutated(ROLLOUTS), lambda d: decode_rollouts(d, LIMITS), 1500, (PayloadError,)),
    "grad_structured": (safetensors_files(), _grad, 1500, (PayloadError,)),
    "grad_mutated": (st.sampled_from(sorted(GRADS)).flatmap(lambda c: mutated(GRADS[c])), _grad, 1500,
                     (PayloadError,)),
    "dag_pb_mutated": (mutated(DAG_NODE), _dag, 800, (IntegrityError,)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fuzz(case):
    strategy, decode, n, errors = CASES[case]
    _fuzz(strategy, decode, n, errors)()


@pytest.mark.fuzz_long
@pytest.mark.parametrize("case", sorted(CASES))
def test_fuzz_long(case, request):
    if "fuzz_long" not in (request.config.getoption("-m") or ""):
        pytest.skip("long fuzzing runs only with -m fuzz_long")
    strategy, decode, n, errors = CASES[case]
    _fuzz(strategy, decode, n, errors, long=True)()


def test_normal_suite_runs_at_least_ten_thousand_inputs():
    assert sum(n for _, _, n, _ in CASES.values()) >= 10_000


@pytest.mark.parametrize("bomb", [
    struct.pack("<Q", 1 << 63) + b"{}",                                                    # huge header length
    struct.pack("<Q", 60) + json.dumps({"a": {"dtype": "F32", "shape": [1 << 40, 1 << 40],
                                              "data_offsets": [0, 0]}}).encode().ljust(60),  # huge shape
    b"[" * 60_000,                                                                           # deep nesting
    b'{"a":' + b"9" * 60_000 + b"}",                                                         # giant integer
])
def test_bombs_do_not_allocate(bomb):
    decoders = (lambda d: decode_header(d, LIMITS), lambda d: decode_rollouts(d, LIMITS), _grad,
                lambda d: parse_safetensors(d, 1 << 20, 1 << 16, 8, "f"))
    for decode in decoders:  # warm up: first-call imports and caches are not the bomb's doing
        with pytest.raises(PayloadError):
            decode(bomb)
    tracemalloc.start()
    try:
        for decode in decoders:
            with pytest.raises(PayloadError):
                decode(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * len(bomb) + (1 << 20), f"peak allocation {peak} bytes"


def test_oversized_inputs_are_refused_before_parsing():
    big = np.zeros(LIMITS.max_rollout_bytes + 1, np.uint8).tobytes()
    tracemalloc.start()
    try:
        with pytest.raises(PayloadError, match="cap"):
            decode_rollouts(big, LIMITS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
