import pytest
import torch

from krill.errors import PayloadError
from krill.rl.aggregate import TrimmedMeanRule, aggregate
from krill.rl.compression import (
    CompressionConfig,
    compress,
    compression_ratio,
    decompress,
    decompress_values,
    mask_seed,
    shared_mask,
)


def _cos(a, b):
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def test_mask_is_a_deterministic_function_of_public_state():
    ref = torch.tensor([0.1, -5.0, 0.2, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    cfg = CompressionConfig(density=0.4, explore_fraction=0.5)
    m = shared_mask("w", 10, ref, cfg, "run-a", 4)
    assert m.tolist() == sorted(m.tolist()) and len(m) == 4
    assert {1, 3} <= set(m.tolist())  # the two largest |reference| coordinates
    assert torch.equal(m, shared_mask("w", 10, ref.clone(), cfg, "run-a", 4))
    others = {tuple(shared_mask("w", 10, ref, cfg, "run-a", v).tolist()) for v in range(20)}
    assert len(others) > 1  # the exploration share changes with the version seed
    assert mask_seed("run-a", 4, "w") != mask_seed("run-a", 4, "v") != mask_seed("run-b", 4, "w")
    assert len(shared_mask("w", 10, None, cfg, "run-a", 0)) == 4  # no reference yet: all random


def test_the_first_dense_versions_send_every_coordinate_then_the_density():
    ref = torch.arange(100, dtype=torch.float32)
    cfg = CompressionConfig(density=0.25, dense_versions=3)
    for version in (0, 1, 2):
        assert torch.equal(shared_mask("w", 100, ref if version else None, cfg, "run-a", version), torch.arange(100))
    later = shared_mask("w", 100, ref, cfg, "run-a", 3)
    assert len(later) == 25
    assert torch.equal(later, shared_mask("w", 100, ref, CompressionConfig(density=0.25), "run-a", 3))
    with pytest.raises(ValueError):
        CompressionConfig(dense_versions=-1)


@pytest.mark.parametrize("dtype,tol", [("fp16", 1e-3), ("bf16", 1e-2), ("int8", 1e-2)])
def test_round_trip_and_measured_ratio(dtype, tol):
    torch.manual_seed(0)
    grads = {"a.weight": torch.randn(64, 48), "b.bias": torch.randn(48) * 1e-3}
    cfg = CompressionConfig(density=0.1, dtype=dtype, block_size=64)
    masks = {n: shared_mask(n, g.numel(), g, cfg, "r", 1) for n, g in grads.items()}
    blob = compress(grads, masks, cfg)
    dense = decompress(blob, masks, {n: g.shape for n, g in grads.items()}, cfg)
    for n, g in grads.items():
        on = masks[n]
        assert torch.allclose(dense[n].reshape(-1)[on], g.reshape(-1)[on], rtol=tol, atol=tol * g.abs().max())
        off = torch.ones(g.numel(), dtype=torch.bool)
        off[on] = False
        assert (dense[n].reshape(-1)[off] == 0).all()
    ratio = compression_ratio(grads, blob)
    assert ratio > (15 if dtype == "int8" else 8)


def test_malformed_payload_rejected():
    cfg = CompressionConfig(density=0.5, dtype="int8", block_size=8)
    masks = {"w": torch.arange(4)}
    blob = compress({"w": torch.ones(8)}, masks, cfg)
    with pytest.raises(PayloadError, match="mask set"):
        decompress_values(blob, {"v": torch.arange(4)}, cfg)
    with pytest.raises(PayloadError, match="int8"):
        decompress_values(blob, {"w": torch.arange(5)}, cfg)
    with pytest.raises(PayloadError, match="safetensors"):
        decompress_values(b"\x00" * 16, masks, cfg)


def test_trimmed_mean_keeps_the_update_on_a_shared_mask_but_not_on_private_top_k():
    # Workers see the same signal through heavy per-worker noise (small RL batches); the public
    # reference is the previous aggregate (signal plus the noise of an n-worker mean).
    gen = torch.Generator().manual_seed(0)
    d, n = 10000, 40
    signal = torch.randn(d, generator=gen) * torch.exp(torch.randn(d, generator=gen))
    noise = 4.0 * float(signal.std())
    updates = signal + noise * torch.randn(n, d, generator=gen)
    reference = signal + noise / n**0.5 * torch.randn(d, generator=gen)
    dense_mean = updates.mean(0)
    rule = TrimmedMeanRule(trim_fraction=0.2)
    cfg = CompressionConfig(density=0.1, explore_fraction=0.2, dtype="int8")

    mask = shared_mask("w", d, reference, cfg, "run", 7)
    values = torch.stack([decompress_values(compress({"w": u}, {"w": mask}, cfg), {"w": mask}, cfg)["w"]
                          for u in updates])
    agg, _ = aggregate(values, torch.ones(n), rule)
    shared = torch.zeros(d)
    shared[mask] = agg

    private = torch.zeros(n, d)
    for k in range(n):
        top = torch.topk(updates[k].abs(), len(mask)).indices
        private[k, top] = updates[k, top]
    independent, _ = aggregate(private, torch.ones(n), rule)

    assert _cos(shared, dense_mean) > 0.72
    assert _cos(independent, dense_mean) < 0.6
    assert shared.norm() > 1.5 * independent.norm()  # private masks also shrink what survives


def test_top_indices_equal_a_stable_descending_sort_with_ties():
    from krill.rl.compression import _top_indices

    g = torch.Generator().manual_seed(3)
    for n, k in [(1000, 1), (1000, 250), (1000, 999), (7, 7), (5000, 1234)]:
        values = torch.randint(0, 20, (n,), generator=g).float()  # many ties
        want = torch.sort(values, descending=True, stable=True).indices[:k]
        assert torch.equal(torch.sort(_top_indices(values, k)).values, torch.sort(want).values)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), 3e38])
def test_int8_blocks_with_unusable_scales_are_rejected(scale):
    from krill.rl.compression import CompressionConfig, decode_values, encode_values

    config = CompressionConfig(dtype="int8", block_size=8)
    parts = encode_values(torch.linspace(-1, 1, 20), config)
    parts["s"][1] = scale
    with pytest.raises(PayloadError) as err:
        decode_values(parts, 20, config)
    assert err.value.field == "s"


def test_int8_encoding_of_a_whole_shard_is_the_per_tensor_encoding():
    from krill.rl.compression import CompressionConfig, _encode_int8_many, encode_values

    config = CompressionConfig(dtype="int8", block_size=16)
    g = torch.Generator().manual_seed(2)
    values = [torch.randn(n, generator=g) * 10 ** float(i % 3) for i, n in enumerate([1, 16, 17, 100, 3])]
    values[2][:] = 0.0  # an all-zero tensor: scale 0
    for one, many in zip([encode_values(v, config) for v in values], _encode_int8_many(values, 16), strict=True):
        assert set(one) == set(many) and all(torch.equal(one[k], many[k]) for k in one)


def test_decompress_names_the_tensor_whose_scales_are_unusable():
    from safetensors.torch import load as st_load
    from safetensors.torch import save as st_save

    from krill.rl.compression import CompressionConfig, compress, decompress_values

    config = CompressionConfig(dtype="int8", block_size=8, density=1.0)
    grads = {"a": torch.randn(20), "b": torch.randn(9)}
    masks = {n: torch.arange(g.numel()) for n, g in grads.items()}
    assert torch.allclose(decompress_values(compress(grads, masks, config), masks, config)["b"], grads["b"], atol=0.05)
    tensors = st_load(compress(grads, masks, config))
    tensors["b/s"][0] = float("inf")
    with pytest.raises(PayloadError) as err:
        decompress_values(st_save(tensors), masks, config)
    assert err.value.field == "b/s"


@pytest.mark.parametrize("dtype", ["int8", "fp16", "bf16"])
def test_compressed_blob_is_byte_for_byte_what_safetensors_writes(dtype):
    """`compress` writes the safetensors bytes itself; they must be the library's."""
    from safetensors.torch import save as st_save

    from krill.rl.compression import _safetensors_bytes

    g = torch.Generator().manual_seed(4)
    cfg = CompressionConfig(density=0.3, dtype=dtype, block_size=16)
    for trial in range(20):
        grads = {f"model.layers.{i}.w{trial % 3}": torch.randn(int(torch.randint(1, 90, (1,), generator=g)), generator=g)
                 for i in range(int(torch.randint(1, 6, (1,), generator=g)))}
        masks = {n: shared_mask(n, t.numel(), t, cfg, "r", trial) for n, t in grads.items()}
        blob = compress(grads, masks, cfg)
        loaded = decompress_values(blob, masks, cfg)
        assert set(loaded) == set(grads)
        from safetensors.torch import load
        tensors = load(blob)
        assert blob == st_save(tensors, metadata={"format": f"krill-masked-grad/1;dtype={dtype}"})
    odd = {"b": torch.ones(3), "a": torch.zeros(0), "c": torch.ones(5, dtype=torch.int8), "é/q": torch.ones(2)}
    assert _safetensors_bytes(odd, {"format": "x"}) == st_save(odd, metadata={"format": "x"})


def test_flat_indices_are_torch_nonzero():
    import torch

    from krill.rl.compression import flat_indices

    generator = torch.Generator().manual_seed(11)
    for n, p in ((0, 0.5), (1, 1.0), (7, 0.0), (1000, 0.3), (65537, 0.9)):
        mask = torch.rand(n, generator=generator) < p
        got, want = flat_indices(mask), torch.nonzero(mask).flatten()
        assert got.dtype == torch.int64 and torch.equal(got, want)
    square = torch.rand(30, 40, generator=generator) < 0.5  # a 2-D mask is read flat
    assert torch.equal(flat_indices(square), torch.nonzero(square.reshape(-1)).flatten())


def test_decoding_refuses_what_the_encoder_never_writes():
    """int8 -128 times the largest accepted scale decoded to -inf (which then failed the shard's whole
    aggregation); a key without `/` was a bare ValueError; an fp16 blob could carry extra parts."""
    from safetensors.torch import save as st_save

    from krill.rl.compression import _MAX_INT8_SCALE, decode_values

    config = CompressionConfig(dtype="int8", block_size=8)
    q, s = torch.tensor([-128, 0, 1, 2], dtype=torch.int8), torch.tensor([_MAX_INT8_SCALE], dtype=torch.float32)
    with pytest.raises(PayloadError, match="-128") as err:
        decompress_values(st_save({"a/q": torch.zeros(3, dtype=torch.int8), "a/s": torch.ones(1), "w/q": q,
                                   "w/s": s}), {"a": torch.arange(3), "w": torch.arange(4)}, config)
    assert err.value.field == "w/q"
    with pytest.raises(PayloadError, match="-128"):
        decode_values({"q": q, "s": s}, 4, config)
    with pytest.raises(PayloadError, match="<tensor>/<part>"):
        decompress_values(st_save({"w": torch.ones(4, dtype=torch.int8)}), {"w": torch.arange(4)}, config)
    fp16 = CompressionConfig(dtype="fp16")
    with pytest.raises(PayloadError, match="unexpected parts"):
        decompress_values(st_save({"w/v": torch.ones(4, dtype=torch.float16), "w/x": torch.ones(9, dtype=torch.float16)}),
                          {"w": torch.arange(4)}, fp16)
    with pytest.raises(PayloadError, match="unexpected parts"):
        decode_values({"q": q.clamp(min=-127), "s": s, "x": s}, 4, config)
