"""Untrusted JSON that is not canonical (bundles, safetensors metadata) is depth-checked before parsing:
a deep document is a clear payload error, never a RecursionError or a C stack overflow."""

import sys

import pytest
import torch
from safetensors.torch import save as st_save

from krill.errors import PayloadError
from krill.payload.canonical import loads_bounded
from krill.payload.errors import MalformedPayloadError

BOMB = "[" * 200_000 + "]" * 200_000


@pytest.fixture(autouse=True)
def web3_recursion_limit():
    """web3 (through py_ecc) raises the limit this far; json's C parser then overflows the C stack on
    a deep enough document instead of raising RecursionError."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(100_000)
    yield
    sys.setrecursionlimit(before)


def test_loads_bounded_refuses_depth_and_names_the_field():
    assert loads_bounded(b'{"a": [1, {"b": 2}]}', 3, "thing") == {"a": [1, {"b": 2}]}
    for bad, why in ((BOMB, "nesting deeper than 4"), ("1" * 5000, "not valid JSON"), (b"\xff", "not valid JSON"),
                     ("{", "not valid JSON")):
        with pytest.raises(MalformedPayloadError, match=why) as info:
            loads_bounded(bad, 4, "thing")
        assert info.value.field == "thing"


def test_a_deep_bundle_is_a_payload_error():
    from krill.model.publish import unbundle_files

    with pytest.raises(PayloadError) as info:
        unbundle_files(BOMB.encode())
    assert info.value.field == "bundle"


def test_deep_safetensors_metadata_is_refused_in_masks_and_optimizer_states():
    from krill.protocol.mask_blob import decode_masks
    from krill.rl.compression import CompressionConfig
    from krill.rl.optimizer import AdamWConfig, OptimizerError, ShardAdamW

    blob = st_save({"w": torch.zeros(2, dtype=torch.uint8)}, metadata={"krill-masks": BOMB})
    with pytest.raises(PayloadError, match="nesting deeper"):
        decode_masks(blob, {"w": torch.Size([16])}, CompressionConfig(), "ab" * 32, 1)
    blob = st_save({"w": torch.zeros(2)}, metadata={"krill-adamw": BOMB})
    with pytest.raises(OptimizerError, match="unreadable metadata"):
        ShardAdamW({"w": torch.zeros(2)}, AdamWConfig()).load_state_bytes(blob)


def test_an_unpaired_surrogate_escape_is_refused_and_a_pair_is_not():
    assert loads_bounded(b'{"a": "\\ud83d\\ude00"}', 3, "thing") == {"a": "\U0001F600"}
    for bad in (b'{"a": "\\ud800"}', b'{"\\uDC00": 1}', b'["x", "\\udbff\\u0041"]'):
        with pytest.raises(MalformedPayloadError, match="unpaired UTF-16 surrogate") as info:
            loads_bounded(bad, 3, "thing")
        assert info.value.field == "thing"
