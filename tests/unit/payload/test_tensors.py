"""Rollouts and gradient shards: round trips, codecs, and every validation failure by name."""

import numpy as np
import pytest
from payload_samples import GRAD_LENGTHS, LIMITS, VOCAB, make_gradients, make_rollouts

from krill.payload import GradientShard, RolloutBatch, decode_gradient_shard, decode_rollouts
from krill.payload.errors import (
    ContextMismatchError,
    DtypeError,
    MalformedPayloadError,
    NonFiniteError,
    OffsetsError,
    PayloadTooLargeError,
    SchemaError,
    ShapeError,
    UnsupportedVersionError,
    ValueRangeError,
)
from krill.payload.tensors import encode_safetensors, parse_safetensors


def test_rollouts_round_trip_and_library_compatibility():
    batch = make_rollouts(np.random.default_rng(1))
    data = batch.encode(LIMITS)
    assert decode_rollouts(data, LIMITS) == batch
    assert batch.encode(LIMITS) == data  # deterministic bytes
    from safetensors.numpy import load

    loaded = load(data)
    assert np.array_equal(loaded["token_ids"], batch.token_ids)
    prompt, completion, lps = batch.sequence(2)
    assert len(prompt) == 4 and len(completion) == 5 and (lps <= 0).all()


def _with(batch: RolloutBatch, **changes) -> RolloutBatch:
    fields = {n: getattr(batch, n) for n in ("token_ids", "offsets", "prompt_lengths", "logprobs", "rewards", "group_ids")}
    return RolloutBatch(**{**fields, **changes})


def _raw(batch: RolloutBatch) -> bytes:
    """Encode without the encoder's validation, as a hostile worker would."""
    from krill.payload.rollout import _DTYPES, FORMAT, VERSION

    return encode_safetensors({n: (d, getattr(batch, n)) for n, d in _DTYPES.items()},
                              {"format": FORMAT, "version": VERSION})


@pytest.mark.parametrize("mutate,error,field", [
    (lambda b: {"token_ids": np.where(np.arange(b.n_tokens) == 3, VOCAB, b.token_ids).astype(np.int32)},
     ValueRangeError, "rollouts.token_ids"),
    (lambda b: {"token_ids": np.where(np.arange(b.n_tokens) == 3, -1, b.token_ids).astype(np.int32)},
     ValueRangeError, "rollouts.token_ids"),
    (lambda b: {"logprobs": np.where(np.arange(b.n_tokens) == 6, np.nan, b.logprobs).astype(np.float32)},
     NonFiniteError, "rollouts.logprobs"),
    (lambda b: {"rewards": np.full(b.n_sequences, np.inf, np.float32)}, NonFiniteError, "rollouts.rewards"),
    (lambda b: {"logprobs": np.where(np.arange(b.n_tokens) == 6, 0.5, b.logprobs).astype(np.float32)},
     ValueRangeError, "rollouts.logprobs"),
    (lambda b: {"logprobs": np.where(np.arange(b.n_tokens) == 0, -0.5, b.logprobs).astype(np.float32)},
     ValueRangeError, "rollouts.logprobs"),
    (lambda b: {"offsets": (b.offsets + np.eye(len(b.offsets), dtype=np.int64)[0])}, OffsetsError, "rollouts.offsets"),
    (lambda b: {"offsets": b.offsets[::-1].copy()}, OffsetsError, "rollouts.offsets"),
    (lambda b: {"offsets": b.offsets[:-1].copy()}, ShapeError, "rollouts.offsets"),
    (lambda b: {"prompt_lengths": np.full(b.n_sequences, 9, np.int32)}, OffsetsError, "rollouts.prompt_lengths"),
    (lambda b: {"group_ids": np.full(b.n_sequences, -2, np.int32)}, ValueRangeError, "rollouts.group_ids"),
    (lambda b: {"rewards": b.rewards[:-1].copy()}, ShapeError, "rollouts.prompt_lengths"),
    (lambda b: {"rewards": np.full(b.n_sequences, 1e9, np.float32)}, ValueRangeError, "rollouts.rewards"),
])
def test_rollout_validation_names_the_field(mutate, error, field):
    batch = make_rollouts(np.random.default_rng(2))
    bad = _with(batch, **mutate(batch))
    with pytest.raises(error) as info:
        decode_rollouts(_raw(bad), LIMITS)
    assert info.value.field == field, info.value
    with pytest.raises(error):
        bad.encode(LIMITS)  # the encoder refuses what peers would refuse


def test_rollout_dtype_caps_and_version():
    batch = make_rollouts(np.random.default_rng(3), n=16)
    from krill.payload.rollout import _DTYPES

    tensors = {n: (d, getattr(batch, n)) for n, d in _DTYPES.items()}
    wrong = dict(tensors, token_ids=("I64", batch.token_ids.astype(np.int64)))
    with pytest.raises(DtypeError, match="rollouts.token_ids"):
        decode_rollouts(encode_safetensors(wrong, {"format": "krill-rollouts", "version": "1"}), LIMITS)
    with pytest.raises(UnsupportedVersionError):
        decode_rollouts(encode_safetensors(tensors, {"format": "krill-rollouts", "version": "2"}), LIMITS)
    with pytest.raises(PayloadTooLargeError, match="sequences"):
        decode_rollouts(batch.encode(LIMITS), LIMITS.model_copy(update={"max_sequences": 15}))
    with pytest.raises(PayloadTooLargeError):
        decode_rollouts(batch.encode(LIMITS), LIMITS.model_copy(update={"max_rollout_bytes": 1024}))


@pytest.mark.parametrize("codec,tolerance", [("fp32", 0), ("fp16", 1e-3), ("bf16", 8e-3), ("int8-block", 1e-2)])
def test_gradient_codecs_round_trip(codec, tolerance):
    rng = np.random.default_rng(4)
    for grad in make_gradients(rng, codec):
        data = grad.encode()
        decoded = decode_gradient_shard(data, GRAD_LENGTHS[grad.shard], LIMITS, grad.shard)
        assert decoded.codec == codec
        for name, values in grad.values.items():
            scale = np.abs(values).max()
            assert np.abs(decoded.values[name] - values).max() <= tolerance * scale + 1e-12, (codec, name)
            assert decoded.values[name].dtype == np.float32


def test_gradient_validation():
    rng = np.random.default_rng(5)
    grad = make_gradients(rng, "fp16")[1]
    lengths = GRAD_LENGTHS[1]
    data = grad.encode()
    with pytest.raises(ContextMismatchError, match="shard"):
        decode_gradient_shard(data, lengths, LIMITS, shard=0)
    with pytest.raises(SchemaError, match="missing"):
        decode_gradient_shard(data, {**lengths, "extra.weight": 3}, LIMITS, 1)
    with pytest.raises(ShapeError, match="lm_head.weight"):
        decode_gradient_shard(data, {**lengths, "lm_head.weight": 71}, LIMITS, 1)
    with pytest.raises(SchemaError, match="codec"):
        decode_gradient_shard(data, lengths, LIMITS, 1, codecs=("fp32",))
    nan = GradientShard(1, "fp32", {**grad.values, "model.norm.weight": np.array([1, 2, np.nan, 4, 5], np.float32)})
    with pytest.raises(NonFiniteError):
        nan.encode()
    meta = {"format": "krill-grad", "version": "1", "shard": "1", "codec": "fp32", "block_size": "256"}
    tensors = {n: ("F32", v) for n, v in nan.values.items()}
    with pytest.raises(NonFiniteError, match="grad-1.model.norm.weight"):
        decode_gradient_shard(encode_safetensors(tensors, meta), lengths, LIMITS, 1)
    with pytest.raises(NonFiniteError, match="fp16"):
        GradientShard(1, "fp16", {"model.norm.weight": np.full(5, 1e6, np.float32)}).encode()



@pytest.mark.parametrize("block_size", ["\u00b2", "\u0661", "\uff11", "9" * 5000, "123456789", "", "0", "1048577",
                                        "-1", "+1", " 1", "1\n", "1_0"])
def test_gradient_block_size_must_be_ascii_digits_in_range(block_size):
    # "²" made int() raise a bare ValueError, "١" was read as 1, 5000 digits passed str.isdigit() and
    # overflowed int()'s digit limit: each must be a SchemaError naming the field.
    grad = make_gradients(np.random.default_rng(6), "fp32")[1]
    meta = {"format": "krill-grad", "version": "1", "shard": "1", "codec": "fp32", "block_size": block_size}
    data = encode_safetensors({n: ("F32", v) for n, v in grad.values.items()}, meta)
    with pytest.raises(SchemaError) as info:
        decode_gradient_shard(data, GRAD_LENGTHS[1], LIMITS, 1)
    assert info.value.field == "grad-1.__metadata__.block_size"
    assert decode_gradient_shard(encode_safetensors({n: ("F32", v) for n, v in grad.values.items()},
                                                    {**meta, "block_size": "1048576"}),
                                 GRAD_LENGTHS[1], LIMITS, 1).block_size == 1 << 20

def test_safetensors_framing_is_strict():
    good = encode_safetensors({"a": ("F32", np.zeros(4, np.float32))}, {})
    parse_safetensors(good, 1 << 20, 1 << 16, 8, "f")
    with pytest.raises(MalformedPayloadError):
        parse_safetensors(good + b"\0", 1 << 20, 1 << 16, 8, "f")  # trailing bytes
    with pytest.raises(PayloadTooLargeError):
        parse_safetensors((1 << 62).to_bytes(8, "little") + good[8:], 1 << 20, 1 << 16, 8, "f")
    lying = good.replace(b'"shape":[4]', b'"shape":[5]')
    with pytest.raises(ShapeError):
        parse_safetensors(lying, 1 << 20, 1 << 16, 8, "f")


@pytest.mark.parametrize("codec", ["bf16", "int8-block"])
def test_every_finite_float32_encodes_to_a_shard_peers_accept(codec):
    # bf16 rounding carried float32's largest values to infinity, and so did 127 x an int8 block scale
    # rounded up: the encoder wrote a shard that every coordinator and verifier refused as non-finite.
    top = np.finfo(np.float32).max
    values = np.array([top, -top, np.nextafter(top, 0), 3.3961e38, -3.4e38, 1.0, 0.0, -1e-3], np.float32)
    for block_size in (1, 3, 256):
        grad = GradientShard(0, codec, {"w": values}, block_size=block_size)
        decoded = decode_gradient_shard(grad.encode(), {"w": len(values)}, LIMITS, 0).values["w"]
        assert np.isfinite(decoded).all()
        step = 2.0 ** -7 if codec == "bf16" else 1 / 127  # one bf16 ulp / one int8 step, relative to the block max
        assert (np.abs(decoded.astype(np.float64) - values) <= step * np.abs(values.astype(np.float64)).max()).all()


def test_int8_decode_costs_what_was_sent_not_what_the_block_size_says():
    # the decoder repeated every scale block_size times: block_size 2**20 in the metadata made a shard
    # of a few hundred bytes allocate 4 MiB per tensor (and the run's block size is checked only later)
    import tracemalloc

    lengths = GRAD_LENGTHS[1]
    meta = {"format": "krill-grad", "version": "1", "shard": "1", "codec": "int8-block", "block_size": str(1 << 20)}
    tensors = {}
    for name, n in lengths.items():
        tensors[name] = ("I8", np.arange(n, dtype=np.int8) - 60)
        tensors[name + "::scale"] = ("F32", np.array([0.5], np.float32))
    data = encode_safetensors(tensors, meta)
    decode_gradient_shard(data, lengths, LIMITS, 1)  # warm up: first-call caches are not the decoder's doing
    tracemalloc.start()
    try:
        decoded = decode_gradient_shard(data, lengths, LIMITS, 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024, f"peak allocation {peak} bytes for a {len(data)}-byte shard"
    for name, n in lengths.items():
        assert np.array_equal(decoded.values[name], (np.arange(n) - 60).astype(np.float32) * np.float32(0.5))
    # every block, the last one short, times its own scale
    rng = np.random.default_rng(7)
    for block_size in (1, 7, 32, 70, 71):
        grad = GradientShard(1, "int8-block", {n: rng.normal(size=k).astype(np.float32) for n, k in lengths.items()},
                             block_size=block_size)
        got = decode_gradient_shard(grad.encode(), lengths, LIMITS, 1)
        from krill.payload.gradient import quantize_int8_blocks

        for name, values in grad.values.items():
            q, scale = quantize_int8_blocks(values, block_size)
            want = q.astype(np.float32) * np.repeat(scale, block_size)[:len(q)]
            assert np.array_equal(got.values[name], want), (block_size, name)
