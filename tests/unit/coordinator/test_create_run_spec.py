"""`krill coordinator create-run`'s spec file: checked before anything happens, its errors one line naming
the file and each key as the TOML spells it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from krill.errors import ConfigError

MANIFEST = SimpleNamespace(architecture={"vocab_size": 100, "max_position_embeddings": 64}, shards=[])


def test_unknown_keys_are_one_line_naming_the_file_and_the_keys_as_written():
    from krill.coordinator.create_run import check_spec

    with pytest.raises(ConfigError) as err:
        check_spec({"seedz": 3, "version": {"contributionz": 5}}, source="spec file f.toml")
    assert str(err.value) == ("spec file f.toml: version.contributionz: Extra inputs are not permitted; "
                              "seedz: Extra inputs are not permitted")
    # A pluggable part's key without pydantic's union tag (`rule.trimmed-mean.bogus`).
    with pytest.raises(ConfigError, match=r"^spec file f\.toml: rule\.bogus: Extra inputs are not permitted$"):
        check_spec({"rule": {"type": "trimmed-mean", "bogus": 1}}, source="spec file f.toml")
    with pytest.raises(ConfigError, match=r"^run spec: loss\.kl_coef 0\.1: the protocol keeps no reference policy"):
        check_spec({"loss": {"kl_coef": 0.1}})
    with pytest.raises(ConfigError, match=r"^--name 'a b': name: String should match pattern"):
        check_spec({}, name="a b")


@pytest.mark.parametrize("table", [{"rollout": {"group_sizes": 4}}, {"rollout": 4}, {"chain": 3}, {"staleness": "x"},
                                   {"limits": 7}])
def test_a_bad_table_is_a_config_error_not_a_traceback(table):
    """A wrong key in `[rollout]` failed in the caps' defaults with pydantic's dump; a `chain` or `staleness`
    that is not a table failed with an AttributeError."""
    from krill.coordinator.create_run import build_spec

    with pytest.raises(ConfigError, match=rf"^spec file f\.toml: {next(iter(table))}"):
        build_spec("unit", MANIFEST, "b" + "c" * 58, 2, table, source="spec file f.toml")


def test_the_shard_count_and_published_fields_are_refused_in_the_file():
    from krill.coordinator.create_run import build_spec, check_spec

    with pytest.raises(ConfigError, match=r"num_shards is set by create-run \(--shards\)"):
        check_spec({"num_shards": 4})  # was silently replaced by --shards
    with pytest.raises(ConfigError, match="base_manifest_cid is set by create-run"):
        check_spec({"base_manifest_cid": "x" * 10})
    spec = build_spec("unit", MANIFEST, "b" + "c" * 58, 3, {"staleness": {"max_staleness": 4}})
    assert (spec.num_shards, spec.chain.max_staleness, spec.limits.vocab_size) == (3, 4, 100)


def test_a_spec_file_that_cannot_be_read_is_one_line(tmp_path):
    from krill.coordinator.create_run import read_spec_file

    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe[version]\n")
    with pytest.raises(ConfigError, match=r"binary\.toml is not valid TOML: not UTF-8 text \(invalid start byte"):
        read_spec_file(binary)
    with pytest.raises(ConfigError, match=r"cannot be read"):
        read_spec_file(tmp_path)


def test_the_command_checks_the_spec_before_the_keystore_and_the_chain(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from krill.cli import cli

    monkeypatch.setenv("KRILL_HOME", str(tmp_path / "home"))  # no keystore, no devnet
    monkeypatch.delenv("KRILL_CONFIG", raising=False)
    spec = tmp_path / "f.toml"
    spec.write_text("seedz = 3\n")
    result = CliRunner().invoke(cli, ["coordinator", "create-run", "--model", str(tmp_path), "--spec", str(spec)])
    assert result.exit_code == 1
    assert result.output.strip() == f"error: spec file {spec}: seedz: Extra inputs are not permitted"
