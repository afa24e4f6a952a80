"""The run spec's encoding is its identity: options added later must not change earlier specs' bytes."""

from __future__ import annotations

import json

from krill.payload import PayloadLimits
from krill.protocol.spec import RunSpec, load_spec, publish_spec
from krill.rl.compression import CompressionConfig
from krill.store.local import LocalStore

CID = "bafkreifjjcie6lypi6ny7amxnfftagclbuxndqonfipmb64f2km2devei4"


def _spec(**kw) -> RunSpec:
    return RunSpec(name="enc", base_manifest_cid=CID, limits=PayloadLimits(vocab_size=16), **kw)


def test_a_sparse_start_is_left_out_so_earlier_specs_keep_their_bytes_and_run_id(tmp_path):
    sparse = _spec()
    assert json.loads(sparse.encode())["compression"] == {"block_size": 256, "density": 0.25, "dtype": "int8",
                                                          "explore_fraction": 0.25}
    dense = _spec(compression=CompressionConfig(density=0.25, dtype="int8", dense_versions=15))
    assert json.loads(dense.encode())["compression"]["dense_versions"] == 15
    assert dense.run_id != sparse.run_id
    store = LocalStore(tmp_path / "store")
    for spec in (sparse, dense):
        loaded = load_spec(store, publish_spec(store, spec))
        assert loaded == spec and loaded.encode() == spec.encode()
