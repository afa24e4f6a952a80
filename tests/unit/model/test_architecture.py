"""A manifest's architecture is checked against its tensors before a model is built from it."""

from __future__ import annotations

import pytest
import torch

from krill.errors import ModelError
from krill.model.architecture import build_model, check_architecture
from krill.model.publish import fetch_tensors, publish_model_dir


@pytest.fixture(scope="module")
def published(tiny_dir, tmp_path_factory):
    from krill.store.local import LocalStore

    store = LocalStore(tmp_path_factory.mktemp("store"))
    manifest, _ = publish_model_dir(store, tiny_dir, 2)
    return store, manifest


def _with(manifest, **changes):
    arch = {k: v for k, v in manifest.architecture.items() if changes.get(k, 0) is not None}
    arch.update({k: v for k, v in changes.items() if v is not None})
    return manifest.model_copy(update={"architecture": arch})


def test_an_honest_manifest_builds_and_takes_its_weights(published):
    store, manifest = published
    assert check_architecture(manifest).vocab_size == manifest.architecture["vocab_size"]
    model = build_model(manifest)
    model.load_state_dict(fetch_tensors(store, manifest), strict=True)
    assert not model.training and next(model.parameters()).dtype == torch.float32


@pytest.mark.parametrize(("changes", "match"), [
    ({"vocab_size": 2**40}, "'model.embed_tokens.weight' has shape \\[1099511627776"),  # 128 TiB, allocated at once
    ({"vocab_size": 4_000_000}, "'model.embed_tokens.weight' has shape \\[4000000"),
    ({"hidden_size": 2**62}, "cannot build a causal LM"),
    ({"num_hidden_layers": 10**7}, "architecture.num_hidden_layers: 10000000 is more than"),
    ({"num_hidden_layers": 3}, "'model.layers.3."),
    ({"model_type": None}, "architecture.model_type: 'None'"),
    ({"model_type": "no-such-model"}, "architecture.model_type: 'no-such-model'"),
    ({"model_type": "gpt2"}, "'transformer.wte.weight' that the manifest does not list"),
])
def test_a_hostile_architecture_is_a_model_error_before_any_allocation(published, changes, match):
    """Built straight from the config, vocab_size 2**40 was a bare RuntimeError from the allocator, 4e6 a
    gigabyte allocated before load_state_dict refused it, a missing or unknown model_type a KeyError."""
    _, manifest = published
    with pytest.raises(ModelError, match=match):
        build_model(_with(manifest, **changes))


def test_layers_missing_from_the_manifest_are_named(published):
    _, manifest = published
    last = manifest.shards[-1]
    kept = [p for p in last.parameters if p.name != "model.layers.3.mlp.up_proj.weight"]
    short = manifest.model_copy(update={"shards": [*manifest.shards[:-1], last.model_copy(update={"parameters": kept})]})
    with pytest.raises(ModelError, match="'model.layers.3.mlp.up_proj.weight' that the manifest does not list"):
        check_architecture(short)


def test_a_mixture_of_experts_with_more_experts_than_layers_builds(tmp_path):
    """An expert count is not bounded by the layer count: an honest mixture of experts has more experts
    than layers (gpt-oss-20b 32 in 24; here 4 in 2), and was refused as 'more than the manifest's tensors
    hold (2)'. An absurd expert count is still refused before anything is built."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from krill.store.local import LocalStore

    config = AutoConfig.for_model("gpt_oss", vocab_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                  num_key_value_heads=2, head_dim=16, max_position_embeddings=64, num_hidden_layers=2,
                                  layer_types=["sliding_attention", "full_attention"], num_local_experts=4,
                                  num_experts_per_tok=2)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "moe")
    (tmp_path / "moe" / "tokenizer.json").write_text("{}")
    store = LocalStore(tmp_path / "store")
    manifest, _ = publish_model_dir(store, tmp_path / "moe", 2)
    assert check_architecture(manifest).num_local_experts == 4
    build_model(manifest).load_state_dict(fetch_tensors(store, manifest), strict=True)
    for absurd in (10**7, len([p for s in manifest.shards for p in s.parameters]) + 1):
        with pytest.raises(ModelError, match=f"architecture.num_local_experts: {absurd} is more than"):
            check_architecture(_with(manifest, num_local_experts=absurd))
