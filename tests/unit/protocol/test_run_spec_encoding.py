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


def test_a_partial_compression_or_optimizer_table_keeps_the_run_defaults_it_does_not_name():
    data = {"name": "enc", "base_manifest_cid": CID, "limits": PayloadLimits(vocab_size=16).model_dump()}
    plain = RunSpec.model_validate(data)
    partial = RunSpec.model_validate({**data, "compression": {"dense_versions": 15}, "optimizer": {"weight_decay": 0.01}})
    # the run defaults (25% int8, lr 1.5e-4), not CompressionConfig's 10% and AdamWConfig's 1e-4
    assert (partial.compression.density, partial.compression.dtype, partial.compression.dense_versions) == (0.25, "int8", 15)
    assert (partial.optimizer.lr, partial.optimizer.weight_decay) == (1.5e-4, 0.01)
    assert partial.compression.model_copy(update={"dense_versions": 0}) == plain.compression
    # a table naming every field means what it says, and a spec read back from its bytes is the same spec
    named = RunSpec.model_validate({**data, "compression": {"density": 0.1, "dtype": "fp16"}})
    assert (named.compression.density, named.compression.dtype) == (0.1, "fp16")
    assert RunSpec.model_validate(json.loads(partial.encode())) == partial
    assert RunSpec.model_validate(json.loads(plain.encode())).encode() == plain.encode()
    # `krill train local` starts from the same run defaults, so its runs compare with a protocol run's
    from krill.rl.local_train import LocalTrainConfig

    local = LocalTrainConfig()
    assert (local.compression, local.optimizer) == (plain.compression, plain.optimizer)
    # and so does its command line, whose defaults are written out to keep `krill --help` free of torch
    from krill.commands.train_cmd import local as local_command

    defaults = {p.name: p.default for p in local_command.params}
    assert (defaults["lr"], defaults["density"], defaults["value_dtype"], defaults["dense_versions"]) == (
        plain.optimizer.lr, plain.compression.density, plain.compression.dtype, plain.compression.dense_versions)


def test_the_learner_temperature_must_be_the_sampling_temperature():
    import pytest
    from pydantic import ValidationError

    from krill.protocol.spec import RolloutSpec
    from krill.rl.loss import LossConfig

    with pytest.raises(ValidationError, match=r"loss.temperature 1 must equal the sampling temperature .* = 0.5"):
        _spec(rollout=RolloutSpec(temperature_milli=500))
    assert _spec(rollout=RolloutSpec(temperature_milli=500), loss=LossConfig(temperature=0.5)).loss.temperature == 0.5
    assert _spec().loss.temperature == 1.0


def test_a_kl_penalty_is_refused_since_no_role_keeps_a_reference_policy():
    import pytest
    from pydantic import ValidationError

    from krill.rl.loss import LossConfig

    with pytest.raises(ValidationError, match="loss.kl_coef 0.1: the protocol keeps no reference policy"):
        _spec(loss=LossConfig(kl_coef=0.1))


def test_a_new_run_clips_to_the_non_zero_median_and_a_published_spec_keeps_the_basis_it_named(tmp_path):
    """The clip limit's basis changed (zero updates set the plain median to 0): new runs name the new basis,
    and a spec published before the option (no `clip_basis`) keeps its bytes, its run id and its plain
    median, so its versions are recomputed as they were folded."""
    from krill.rl.aggregate import ClipMixTrimRule, MedianRule

    new = _spec()
    assert json.loads(new.encode())["rule"]["clip_basis"] == "nonzero-median"
    partial = RunSpec.model_validate({**json.loads(new.encode()), "rule": {"type": "clip-mix-trim", "trim_fraction": 0.3}})
    assert partial.rule.clip_basis == "nonzero-median"  # a table naming other fields takes the run default
    assert isinstance(RunSpec.model_validate({**json.loads(new.encode()), "rule": {"type": "median"}}).rule, MedianRule)
    store = LocalStore(tmp_path / "store")
    old_bytes = _spec(rule=ClipMixTrimRule()).encode()  # as published before the option: no clip_basis
    assert "clip_basis" not in json.loads(old_bytes)["rule"]
    run_id = store.put_block(old_bytes, pin=True) and __import__("hashlib").sha256(old_bytes).digest()
    loaded = load_spec(store, run_id)
    assert loaded.rule.clip_basis == "median" and loaded.encode() == old_bytes and loaded.run_id == run_id
    assert load_spec(store, publish_spec(store, new)).rule.clip_basis == "nonzero-median"


def test_a_new_run_reduces_by_the_fixed_tree_and_a_published_spec_keeps_torchs(tmp_path):
    """The fold's sums over coordinates changed to a fixed tree (torch's order depends on the CPU): a new
    run names it, for any rule type, and a spec published before the option (no `reductions`) keeps its
    bytes, its run id and torch's reductions, so its versions are recomputed as they were folded."""
    from krill.rl.aggregate import ClipMixTrimRule, MedianRule
    from krill.rl.local_train import LocalTrainConfig

    new = _spec()
    assert new.rule.reductions == "fixed-tree" and json.loads(new.encode())["rule"]["reductions"] == "fixed-tree"
    table = json.loads(new.encode())
    for rule in ({"type": "median"}, {"type": "clip-mix-trim", "trim_fraction": 0.3}, {"type": "mean"}):
        assert RunSpec.model_validate({**table, "rule": rule}).rule.reductions == "fixed-tree"
    assert LocalTrainConfig().rule.reductions == "fixed-tree"
    assert LocalTrainConfig(rule={"type": "trimmed-mean"}).rule.reductions == "fixed-tree"
    store = LocalStore(tmp_path / "store")
    for before in (ClipMixTrimRule(), MedianRule()):  # as published before the option: no reductions
        old_bytes = _spec(rule=before).encode()
        assert "reductions" not in json.loads(old_bytes)["rule"]
        run_id = store.put_block(old_bytes, pin=True) and __import__("hashlib").sha256(old_bytes).digest()
        loaded = load_spec(store, run_id)
        assert loaded.rule.reductions == "torch" and not loaded.rule.fixed
        assert loaded.encode() == old_bytes and loaded.run_id == run_id
    assert load_spec(store, publish_spec(store, new)).rule.reductions == "fixed-tree"


def test_chain_parameters_the_contract_refuses_are_refused_before_anything_is_published():
    """The contract takes a quorum of at most MAX_ATTESTATIONS (32) and a uint256 reward; a spec that passed
    with a quorum of 33 to 64 reverted `createRun` after the model and the spec were published."""
    import pytest
    from pydantic import ValidationError

    from krill.protocol.spec import ChainSpec

    assert _spec(chain=ChainSpec(attestation_quorum=32, reward_per_version=(1 << 256) - 1)).chain.attestation_quorum == 32
    with pytest.raises(ValidationError, match="attestation_quorum"):
        ChainSpec(attestation_quorum=33)
    with pytest.raises(ValidationError, match="reward_per_version"):
        ChainSpec(reward_per_version=1 << 256)


def test_a_new_run_orders_reward_ties_by_hash_and_a_published_spec_keeps_address_ties(tmp_path):
    """Settlement ties (the 64-account cut, the remainders' units) went to the lower address, which
    accounts ground to low addresses win on every version: a new run names `hashed`, and a spec
    published before the option (no `reward` table) keeps its bytes, its run id and address ties, so
    the audit recomputes its settlements as they were paid."""
    import hashlib
    from pathlib import Path

    from krill.protocol.spec import RewardSpec

    new = _spec()
    assert new.reward.ties == "hashed" and json.loads(new.encode())["reward"] == {"ties": "hashed"}
    table = json.loads(new.encode())
    assert RunSpec.model_validate({**table, "reward": {}}).reward.ties == "hashed"  # a table naming no rule
    assert RunSpec.model_validate({k: v for k, v in table.items() if k != "reward"}).reward.ties == "hashed"
    assert RunSpec.model_validate({**table, "reward": {"ties": "address"}}).reward.ties == "address"
    old_bytes = (Path(__file__).parent / "spec_before_reward_ties.json").read_bytes()  # encoded before the option
    run_id = hashlib.sha256(old_bytes).digest()
    assert run_id.hex() == "87917f366e18c4d57c06a07041eedd2894566116b3cb7f3c99c7c63f7f29237b"
    store = LocalStore(tmp_path / "store")
    store.put_block(old_bytes, pin=True)
    loaded = load_spec(store, run_id)
    assert loaded.reward.ties == "address" and loaded.encode() == old_bytes and loaded.run_id == run_id
    assert _spec(reward=RewardSpec(ties="address")).encode() == old_bytes  # address ties are left out
    assert load_spec(store, publish_spec(store, new)).reward.ties == "hashed"


def test_a_new_spec_must_fit_its_rollout_shape_and_a_published_one_is_read_as_written(tmp_path):
    """Caps under one honest contribution (prompts x group size sequences, prompts groups) refuse every
    honest contribution, and a minimum over the count never applies: a new spec is refused with one line
    naming the fields; a published spec that has them (create-run took them before) still decodes."""
    import hashlib

    import pytest
    from pydantic import ValidationError

    from krill.protocol.spec import RolloutSpec, VersionSpec

    shape = RolloutSpec(prompts_per_contribution=4, group_size=4)
    fits = RunSpec(name="enc", base_manifest_cid=CID, rollout=shape,
                   version=VersionSpec(contributions=3, min_contributions=3),
                   limits=PayloadLimits(vocab_size=16, max_sequences=16, max_groups=4))
    assert fits.limits.max_sequences == 16
    for limits, version, words in (
            ({"max_sequences": 8}, {}, r"limits.max_sequences 8 is under rollout.prompts_per_contribution x "
                                       r"rollout.group_size = 16: every honest contribution would be refused"),
            ({"max_groups": 2}, {}, r"limits.max_groups 2 is under rollout.prompts_per_contribution 4"),
            ({}, {"contributions": 2, "min_contributions": 3},
             r"version.min_contributions 3 is over version.contributions 2")):
        data = json.loads(fits.encode())
        data["limits"].update(limits)
        data["version"].update(version)
        with pytest.raises(ValidationError, match=words):
            RunSpec.model_validate(data)
        published = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
        store = LocalStore(tmp_path / "store")
        store.put_block(published, pin=True)
        assert load_spec(store, hashlib.sha256(published).digest()).encode() == published


def test_a_spec_file_with_a_large_shape_and_no_caps_passes_the_checks_before_publishing():
    """create-run derives max_sequences and max_groups from the rollout shape when the file sets none, so
    the checks run before the model is published (create-run's and the demo's) must not hold the shape
    against the class default caps (4096 sequences): 64 prompts x 128 was refused there. A cap the file
    does set is still checked against its shape."""
    import pytest

    from krill.coordinator.create_run import check_spec
    from krill.demo.orchestrate import DemoConfig
    from krill.demo.orchestrate import check_spec as check_demo_spec
    from krill.errors import ConfigError

    large = {"rollout": {"prompts_per_contribution": 64, "group_size": 128}}
    assert check_spec(large).limits.max_sequences == 64 * 128
    check_demo_spec(DemoConfig(spec_overrides=large))
    with pytest.raises(ConfigError, match=r"limits.max_sequences 4096 is under"):
        check_spec({**large, "limits": {"max_sequences": 4096}})
    with pytest.raises(ConfigError, match=r"rollout"):  # a rollout table that does not validate is named
        check_spec({"rollout": {"group_size": 1}})
