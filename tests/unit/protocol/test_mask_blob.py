"""The published masks blob: exact round trip, stable bytes, and every malformed blob rejected by name."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
from safetensors.torch import save as st_save

from krill.errors import ModelError, PayloadError
from krill.protocol.mask_blob import decode_masks, encode_masks
from krill.rl.compression import CompressionConfig, mask_size, shared_masks

RUN = "ab" * 32
SHAPES = {"a.weight": torch.Size([37, 11]), "b.bias": torch.Size([5]), "c.weight": torch.Size([64, 8])}
CONFIG = CompressionConfig(density=0.25)


def _masks(version=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    refs = {n: torch.randn(s, generator=g) for n, s in SHAPES.items()}
    return shared_masks(SHAPES, refs, CONFIG, RUN, version)


def test_round_trip_is_exact_and_bytes_are_a_function_of_the_masks():
    masks = _masks()
    blob = encode_masks(masks, SHAPES, RUN, 3)
    assert blob == encode_masks(dict(reversed(list(masks.items()))), SHAPES, RUN, 3)
    decoded = decode_masks(blob, SHAPES, CONFIG, RUN, 3)
    assert list(decoded) == sorted(SHAPES)
    for n in SHAPES:
        assert decoded[n].dtype == torch.int64 and torch.equal(decoded[n], masks[n])
        assert decoded[n].numel() == mask_size(SHAPES[n].numel(), CONFIG, 3)
    assert encode_masks(_masks(seed=1), SHAPES, RUN, 3) != blob
    # 1 bit per coordinate, against 2 x 32 bits per coordinate for the AdamW state workers fetched before.
    assert len(blob) < sum(s.numel() for s in SHAPES.values()) / 8 + 400


def _raw(tensors, meta):
    return st_save(tensors, metadata={"krill-masks": json.dumps(meta, sort_keys=True)})


def _packed(masks):
    out = {}
    for n, s in SHAPES.items():
        bits = np.zeros(s.numel(), dtype=bool)
        bits[masks[n].numpy()] = True
        out[n] = torch.from_numpy(np.packbits(bits, bitorder="little"))
    return out


META = {"format": "krill-masks/1", "run": RUN, "version": 3}


@pytest.mark.parametrize("case, field, words", [
    ("garbage", "masks", "not a safetensors"),
    ("format", "masks", "krill-masks/1"),
    ("version", "masks", "version 4"),
    ("missing", "masks", "names differ"),
    ("dtype", "masks/b.bias", "uint8"),
    ("length", "masks/c.weight", "expected 64 uint8 bytes"),
    ("padding", "masks/a.weight", "padding"),
    ("count", "masks/c.weight", "compression gives 128 at version 3"),
])
def test_malformed_blobs_are_rejected_naming_what_is_wrong(case, field, words):
    tensors, meta = _packed(_masks()), dict(META)
    if case == "garbage":
        blob = b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}"
    else:
        if case == "format":
            meta["format"] = "krill-masks/0"
        elif case == "version":
            meta["version"] = 4
        elif case == "missing":
            del tensors["b.bias"]
        elif case == "dtype":
            tensors["b.bias"] = tensors["b.bias"].to(torch.int16)
        elif case == "length":
            tensors["c.weight"] = torch.cat([tensors["c.weight"], torch.zeros(1, dtype=torch.uint8)])
        elif case == "padding":  # 407 coordinates: the last byte holds one unused bit
            tensors["a.weight"] = tensors["a.weight"].clone()
            tensors["a.weight"][-1] |= 0x80
        elif case == "count":  # one coordinate more than the density allows
            bits = np.unpackbits(tensors["c.weight"].numpy(), bitorder="little")
            bits[np.flatnonzero(bits == 0)[0]] = 1
            tensors["c.weight"] = torch.from_numpy(np.packbits(bits, bitorder="little"))
        blob = _raw(tensors, meta)
    with pytest.raises(PayloadError) as err:
        decode_masks(blob, SHAPES, CONFIG, RUN, 3)
    assert err.value.field == field and words in str(err.value)


def test_during_the_dense_versions_only_a_full_mask_is_accepted():
    dense = CompressionConfig(density=0.25, dense_versions=4)
    sparse = encode_masks(_masks(), SHAPES, RUN, 3)
    with pytest.raises(PayloadError, match="compression gives 407 at version 3"):
        decode_masks(sparse, SHAPES, dense, RUN, 3)
    full = shared_masks(SHAPES, None, dense, RUN, 3)
    decoded = decode_masks(encode_masks(full, SHAPES, RUN, 3), SHAPES, dense, RUN, 3)
    assert all(torch.equal(decoded[n], torch.arange(SHAPES[n].numel())) for n in SHAPES)


def test_a_version_rejects_masks_that_do_not_hash_to_its_record(tiny_run):
    """A store answering other bytes for the record's masks CID is refused before they are used."""
    store, spec, base, _workers = tiny_run

    class Lying:
        def get(self, cid, **kw):
            return b"\x00" * 64

    from types import SimpleNamespace

    from krill.protocol.state import VersionState

    record = SimpleNamespace(masks_cid="bafkreifake", masks_sha256=hashlib.sha256(b"x").hexdigest())
    state = VersionState(spec, 1, base.manifest, base.manifest_cid, record, "bafkreirecord", Lying())
    with pytest.raises(ModelError, match="sha256"):
        state.masks()


def test_a_version_reads_the_honest_masks_of_a_model_with_many_tensors(tmp_path):
    """The read cap counted 64 KiB for the whole safetensors header (~110 bytes and the name per tensor):
    a 64-layer Qwen2-style model's blob (768 tensors) was refused as too large by every worker and verifier."""
    from types import SimpleNamespace

    from krill.payload.limits import PayloadLimits
    from krill.protocol.spec import RunSpec
    from krill.protocol.state import VersionState
    from krill.store.local import LocalStore

    spec = RunSpec(name="many", base_manifest_cid="b" + "a" * 58, limits=PayloadLimits(vocab_size=16))
    kinds = [f"self_attn.{p}_proj.weight" for p in "qkvo"] + [f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")]
    kinds += ["input_layernorm.weight", "post_attention_layernorm.weight"] + [f"self_attn.{p}_proj.bias" for p in "qkv"]
    params = [SimpleNamespace(name=f"model.layers.{i}.{k}", shape=[64]) for i in range(64) for k in kinds]
    manifest = SimpleNamespace(shards=[SimpleNamespace(parameters=params)], num_shards=1)
    shapes = {p.name: torch.Size(p.shape) for p in params}
    masks = shared_masks(shapes, None, spec.compression, spec.run_id.hex(), 1)
    blob = encode_masks(masks, shapes, spec.run_id.hex(), 1)
    store = LocalStore(tmp_path)
    record = SimpleNamespace(masks_cid=store.add(blob, pin=True), masks_sha256=hashlib.sha256(blob).hexdigest())
    read = VersionState(spec, 1, manifest, "bafkreimanifest", record, "bafkreirecord", store).published_masks()
    assert len(read) == 768 and all(torch.equal(read[n], masks[n]) for n in shapes)
