"""A published version is untrusted input: a later manifest may not change the base model's form, and
a hostile architecture or tokenizer is a ModelError before anything large is allocated."""

from __future__ import annotations

import hashlib

import pytest

from krill.errors import ModelError
from krill.model.publish import bundle_files, unbundle_files
from krill.protocol.policy import build_model, load_tokenizer
from krill.protocol.record import AggregationRecord, publish_record
from krill.protocol.state import load_version


def _version_one(store, spec, base, manifest):
    """Publish `manifest` as version 1 with a record naming it (what a hostile coordinator can do)."""
    from krill.store.cid import digest_to_cid

    manifest = manifest.model_copy(update={"version": 1, "parent": base.manifest_cid})
    data = manifest.canonical_bytes()
    cid = store.add(data, pin=True)
    assert cid == digest_to_cid(hashlib.sha256(data).digest())
    record = AggregationRecord(run_id=spec.run_id.hex(), version=1, parent_manifest_cid=base.manifest_cid,
                               parent_record_cid=None, manifest_cid=cid, rule=spec.rule.model_dump(mode="json"),
                               accepted=[], rejected=[], shards=[], masks_cid=base.manifest.tokenizer,
                               masks_sha256="0" * 64, closed_by="count")
    publish_record(store, record)
    return load_version(store, spec, 1, hashlib.sha256(data).digest(), record.digest)


def _hostile(base, **architecture):
    return base.manifest.model_copy(update={"architecture": {**base.manifest.architecture, **architecture}})


def test_a_version_that_keeps_the_base_form_loads(tiny_run):
    store, spec, base, _ = tiny_run
    v1 = _version_one(store, spec, base, base.manifest)
    assert v1.manifest.architecture == base.manifest.architecture


@pytest.mark.parametrize("change", [{"vocab_size": 2**40}, {"rms_norm_eps": 0.5}, {"num_hidden_layers": 1}])
def test_a_version_that_changes_the_base_architecture_is_refused(tiny_run, change):
    store, spec, base, _ = tiny_run
    with pytest.raises(ModelError, match="changes the base model's architecture"):
        _version_one(store, spec, base, _hostile(base, **change))


def test_a_version_that_changes_the_tokenizer_or_a_shape_is_refused(tiny_run):
    store, spec, base, _ = tiny_run
    other = base.manifest.model_copy(update={"tokenizer": base.manifest.shards[0].cid})
    with pytest.raises(ModelError, match="tokenizer or parameters"):
        _version_one(store, spec, base, other)
    shard = base.manifest.shards[0]
    first = shard.parameters[0].model_copy(update={"shape": [*shard.parameters[0].shape, 1]})
    reshaped = shard.model_copy(update={"parameters": [first, *shard.parameters[1:]]})
    grown = base.manifest.model_copy(update={"shards": [reshaped, *base.manifest.shards[1:]]})
    with pytest.raises(ModelError, match="tokenizer or parameters"):
        _version_one(store, spec, base, grown)


def test_building_a_hostile_architecture_is_a_model_error_not_an_allocation(tiny_run):
    store, spec, base, _ = tiny_run
    hostile = _hostile(base, vocab_size=2**40)
    state = type(base)(spec, 0, hostile, base.manifest_cid, None, None, store)
    with pytest.raises(ModelError, match="architecture"):
        build_model(state)


def test_a_hostile_tokenizer_bundle_is_a_model_error(tiny_run):
    store, spec, base, _ = tiny_run
    files = unbundle_files(store.get(base.manifest.tokenizer))
    broken = bundle_files({**files, "tokenizer.json": b"not json"})
    cid = store.add(broken, pin=True)
    state = type(base)(spec, 0, base.manifest.model_copy(update={"tokenizer": cid}), base.manifest_cid, None, None,
                       store)
    with pytest.raises(ModelError, match="tokenizer"):
        load_tokenizer(state)
