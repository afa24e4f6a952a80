"""A tiny published run (local store, random tiny Llama) shared by the protocol core tests."""

from __future__ import annotations

import pytest
from nacl.signing import SigningKey

from krill.model.build import TinyModelSpec, build_tiny_model
from krill.model.publish import publish_model_dir
from krill.payload.limits import PayloadLimits
from krill.protocol.spec import RolloutSpec, RunSpec, VersionSpec
from krill.protocol.state import load_version
from krill.protocol.work import Identity
from krill.rl.compression import CompressionConfig
from krill.store.local import LocalStore

SPEC = TinyModelSpec(hidden=32, layers=2, heads=2, intermediate=64)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    import hashlib

    root = tmp_path_factory.mktemp("tiny-run")
    model, tokenizer = build_tiny_model(seed=3, spec=SPEC, directory=root / "model")
    store = LocalStore(root / "store")
    manifest, manifest_cid = publish_model_dir(store, root / "model", num_shards=2)
    spec = RunSpec(name="unit", seed=7, task="arithmetic", base_manifest_cid=manifest_cid, num_shards=2,
                   rollout=RolloutSpec(prompts_per_contribution=4, group_size=4),
                   version=VersionSpec(contributions=2), compression=CompressionConfig(density=0.25, dtype="int8", dense_versions=1),
                   limits=PayloadLimits(vocab_size=tokenizer.vocab_size + 8))
    base = load_version(store, spec, 0, hashlib.sha256(manifest.canonical_bytes()).digest(), None)
    keys = [SigningKey(bytes([i + 1]) * 32) for i in range(3)]
    workers = [Identity(31337, "0x" + "ab" * 20, "0x" + f"{i + 1:02x}" * 20, keys[i]) for i in range(3)]
    return store, spec, base, workers
