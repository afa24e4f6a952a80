"""Shard planning, shard bytes, publishing to a store and assembling back bit-exactly."""

from __future__ import annotations

import json

import pytest
import torch

from krill.errors import ModelError
from krill.model.build import load_model
from krill.model.publish import (
    assemble_model_dir,
    fetch_shard,
    fetch_tensors,
    load_manifest,
    load_version,
    publish_model_dir,
    publish_update,
    read_model_dir,
)
from krill.model.shards import plan_shards, shard_from_bytes, shard_to_bytes


def _names(layers):
    names = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    for i in range(layers):
        names += [f"model.layers.{i}.self_attn.q_proj.weight", f"model.layers.{i}.mlp.up_proj.weight"]
    return names


@pytest.mark.parametrize(("layers", "shards", "sizes"), [(4, 1, [4]), (4, 2, [2, 2]), (5, 3, [2, 2, 1]), (4, 4, [1] * 4)])
def test_plan_is_contiguous_and_even(layers, shards, sizes):
    plan = plan_shards(_names(layers), layers, shards)
    assert plan[0][0] == "model.embed_tokens.weight"
    assert plan[-1][-2:] == ["lm_head.weight", "model.norm.weight"]
    assert sorted(sum(plan, [])) == sorted(_names(layers))
    layer_sets = [sorted({int(n.split(".")[2]) for n in s if ".layers." in n}) for s in plan]
    assert [len(s) for s in layer_sets] == sizes
    flat = sum(layer_sets, [])
    assert flat == list(range(layers))


def test_plan_rejects_more_shards_than_layers():
    with pytest.raises(ModelError, match="num_shards"):
        plan_shards(_names(2), 2, 3)


def test_shard_bytes_are_deterministic():
    tensors = {"b": torch.arange(6, dtype=torch.float32).view(2, 3).t(), "a": torch.ones(3, dtype=torch.bfloat16)}
    data = shard_to_bytes(tensors)
    assert data == shard_to_bytes(dict(reversed(tensors.items())))
    back = shard_from_bytes(data)
    assert torch.equal(back["b"], tensors["b"]) and back["a"].dtype == torch.bfloat16
    with pytest.raises(ModelError, match="shard"):
        shard_from_bytes(b"not safetensors")


@pytest.mark.parametrize("num_shards", [1, 2, 3])
def test_publish_assemble_round_trip_is_bit_exact(tiny_dir, store, tmp_path, num_shards):
    manifest, cid = publish_model_dir(store, tiny_dir, num_shards)
    assert manifest.num_shards == num_shards and manifest.version == 0 and manifest.parent is None
    loaded = load_manifest(store, cid)
    assert loaded == manifest
    out = assemble_model_dir(store, loaded, tmp_path / "out")
    original, arch, aux = read_model_dir(tiny_dir)
    back, arch2, aux2 = read_model_dir(out)
    assert arch2 == arch and aux2 == aux
    assert original.keys() == back.keys()
    for name, tensor in original.items():
        assert tensor.dtype == back[name].dtype
        assert tensor.numpy().tobytes() == back[name].numpy().tobytes()
    assert publish_model_dir(store, out, num_shards)[1] == cid
    model, tok = load_version(store, loaded)
    ref, _ = load_model(tiny_dir)
    ids = torch.tensor([tok("12+34+56=")["input_ids"]])
    assert torch.equal(model(input_ids=ids).logits, ref(input_ids=ids).logits)


def test_manifest_describes_shards(tiny_dir, store):
    manifest, _ = publish_model_dir(store, tiny_dir, 2)
    tensors, arch, _ = read_model_dir(tiny_dir)
    assert manifest.architecture == arch
    assert manifest.shard_of("lm_head.weight") == 1 and manifest.shard_of("model.embed_tokens.weight") == 0
    for entry in manifest.shards:
        got = fetch_shard(store, manifest, entry.index)
        for p in entry.parameters:
            assert list(got[p.name].shape) == p.shape == list(tensors[p.name].shape)


def test_fetch_refuses_a_substituted_shard(tiny_dir, store):
    manifest, _ = publish_model_dir(store, tiny_dir, 2)
    other = manifest.shards[1]
    swapped = manifest.shards[0].model_copy(update={"cid": other.cid, "sha256": other.sha256, "size": other.size})
    forged = manifest.model_copy(update={"shards": [swapped, other]})
    with pytest.raises(ModelError, match="names, shapes or dtypes"):
        fetch_shard(store, forged, 0)
    wrong_sha = manifest.model_copy(update={"shards": [manifest.shards[0].model_copy(update={"sha256": "0" * 64}),
                                                       manifest.shards[1]]})
    with pytest.raises(ModelError, match="sha256"):
        fetch_shard(store, wrong_sha, 0)


def test_publish_update_replaces_only_given_shards(tiny_dir, store):
    base, base_cid = publish_model_dir(store, tiny_dir, 2)
    shard1 = {k: v + 1 for k, v in fetch_shard(store, base, 1).items()}
    nxt, nxt_cid = publish_update(store, base, base_cid, {1: shard1}, version=1)
    assert nxt.parent == base_cid and nxt.version == 1 and nxt_cid != base_cid
    assert nxt.shards[0] == base.shards[0] and nxt.shards[1].cid != base.shards[1].cid
    assert all(torch.equal(v, shard1[k]) for k, v in fetch_shard(store, nxt, 1).items())
    bad = dict(shard1)
    bad.pop(next(iter(bad)))
    with pytest.raises(ModelError, match="shard 1"):
        publish_update(store, base, base_cid, {1: bad}, version=1)
    with pytest.raises(ModelError, match="version"):
        publish_update(store, base, base_cid, {1: shard1}, version=0)


def test_config_json_in_assembled_dir_parses(tiny_dir, store, tmp_path):
    manifest, _ = publish_model_dir(store, tiny_dir, 2)
    out = assemble_model_dir(store, manifest, tmp_path / "o")
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 4


def test_a_bf16_base_model_is_published_in_float32(tiny_dir, store, tmp_path):
    """The fold steps a float32 copy and every version keeps its parent's dtypes: a bf16 base rounded each
    version's update back to bf16, losing any step under half a bf16 ulp."""
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    bf16 = tmp_path / "bf16"
    shutil.copytree(tiny_dir, bf16)
    weights = bf16 / "model.safetensors"
    save_file({n: t.to(torch.bfloat16) for n, t in load_file(str(weights)).items()}, str(weights))
    config = json.loads((bf16 / "config.json").read_text())
    config["torch_dtype"] = "bfloat16"
    (bf16 / "config.json").write_text(json.dumps(config))
    manifest, _ = publish_model_dir(store, bf16, 2)
    assert {p.dtype for s in manifest.shards for p in s.parameters} == {"F32"}
    assert manifest.architecture["torch_dtype"] == "float32"
    narrow = load_file(str(weights))
    fetched = fetch_tensors(store, manifest)
    assert all(torch.equal(fetched[n], narrow[n].to(torch.float32)) for n in narrow)  # widened exactly


class _CountingStore:
    """A store that records the byte cap of every read (what a hostile CID could make a role download)."""

    def __init__(self, store):
        self.store, self.caps = store, []

    def get(self, cid, max_bytes=None, sha256=None):
        self.caps.append(max_bytes)
        return self.store.get(cid, max_bytes=max_bytes, sha256=sha256)


def test_manifest_and_shard_reads_are_capped_before_download(tiny_dir, store):
    """A manifest is read up to MAX_MANIFEST_BYTES and a shard up to its manifest's size; the store's 1 GiB
    default was the only bound, so a manifest CID naming a large file was downloaded whole first."""
    from krill.model.manifest import MAX_MANIFEST_BYTES
    from krill.store.local import LocalStore

    manifest, cid = publish_model_dir(store, tiny_dir, 2)
    counting = _CountingStore(store)
    load_manifest(counting, cid)
    fetch_shard(counting, manifest, 1)
    assert counting.caps == [MAX_MANIFEST_BYTES, manifest.shards[1].size]

    small = LocalStore(store.root, max_get_bytes=1 << 40)
    big = small.add(b"{" * (MAX_MANIFEST_BYTES + 1))
    with pytest.raises(ModelError, match="larger than a manifest"):
        load_manifest(small, big)
    longer = manifest.shards[1].model_copy(update={"cid": big})
    with pytest.raises(ModelError, match="more than the manifest's size"):
        fetch_shard(small, manifest.model_copy(update={"shards": [manifest.shards[0], longer]}), 1)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_fetch_refuses_non_finite_weights(tiny_dir, store, bad):
    """A published shard with NaN or infinite weights is refused on fetch (ModelError, a broken version), not
    built into a model whose every logit is NaN."""
    import hashlib

    from krill.model.publish import _add

    manifest, _ = publish_model_dir(store, tiny_dir, 2)
    tensors = fetch_shard(store, manifest, 0)
    name = next(iter(tensors))
    poisoned = dict(tensors)
    poisoned[name] = tensors[name].clone()
    poisoned[name].view(-1)[3] = bad
    data = shard_to_bytes(poisoned)
    entry = manifest.shards[0].model_copy(update={"cid": _add(store, data), "size": len(data),
                                                  "sha256": hashlib.sha256(data).hexdigest()})
    forged = manifest.model_copy(update={"shards": [entry, manifest.shards[1]]})
    with pytest.raises(ModelError, match=f"shard 0: tensor '{name}' holds NaN or infinite"):
        fetch_shard(store, forged, 0)
