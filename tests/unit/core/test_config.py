import re
from pathlib import Path

import pytest

from krill.config import KrillConfig, KuboStoreConfig, LocalStoreConfig, load_config, write_config
from krill.errors import ConfigError


def test_defaults_are_embedded_local():
    cfg = load_config(None, environ={})
    assert isinstance(cfg.store, LocalStoreConfig)
    assert cfg.database.url.startswith("sqlite:///")


def test_precedence_file_env_flag(tmp_path: Path):
    path = tmp_path / "k.toml"
    path.write_text('[chain]\nrpc_url = "http://file:1"\nretries = 2\n[run]\nid = "abababababababababababababababababababababababababababababababab"\n')
    cfg = load_config(path, environ={})
    assert (cfg.chain.rpc_url, cfg.chain.retries, cfg.run.id) == ("http://file:1", 2, "abababababababababababababababababababababababababababababababab")
    cfg = load_config(path, environ={"KRILL_CHAIN__RETRIES": "7"})
    assert cfg.chain.retries == 7 and cfg.chain.rpc_url == "http://file:1"
    cfg = load_config(path, ["chain.retries=9", "run.id=0xcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd"], environ={"KRILL_CHAIN__RETRIES": "7"})
    assert (cfg.chain.retries, cfg.run.id) == (9, "0xcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd")


def test_store_union_selected_by_type():
    cfg = load_config(None, ["store.type=kubo", "store.api_url=http://127.0.0.1:5001"], environ={})
    assert isinstance(cfg.store, KuboStoreConfig)


@pytest.mark.parametrize("override, field", [
    ("chain.retries=-1", "chain.retries"),
    ("chain.protocol_address=0x1234", "chain.protocol_address"),
    ("store.type=ftp", "store"),
    ("run.id=has space", "run.id"),
    ("chain.nonsense=1", "chain.nonsense"),
])
def test_invalid_values_name_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(None, [override], environ={})


def test_bad_override_syntax_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="section.field=value"):
        load_config(None, ["noequals"], environ={})
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml", environ={})
    bad = tmp_path / "bad.toml"
    bad.write_text("[chain\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad, environ={})


def test_masked_hides_every_secret():
    cfg = load_config(None, [
        "chain.rpc_url=https://user:hunter2@rpc.example/v3?key=abcdef",
        "database.url=postgresql+psycopg://krill:s3cret@db/krill",
        "keystore.password=pa55",
    ], environ={})
    text = repr(cfg.masked())
    for secret in ("hunter2", "abcdef", "s3cret", "pa55"):
        assert secret not in text
    assert cfg.keystore.password.get_secret_value() == "pa55"


def test_write_then_load_round_trip(tmp_path):
    cfg = load_config(None, ["chain.chain_id=31337", "keystore.password=pw", "run.id=efefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefef"], environ={})
    path = tmp_path / "out.toml"
    write_config(cfg, path)
    assert (path.stat().st_mode & 0o777) == 0o600
    again = load_config(path, environ={})
    assert again == cfg and isinstance(again, KrillConfig)


def test_hex_values_stay_strings_from_env_and_flags():
    addr = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
    cfg = load_config(None, [f"chain.token_address={addr}"], environ={"KRILL_CHAIN__PROTOCOL_ADDRESS": addr})
    assert cfg.chain.protocol_address == addr == cfg.chain.token_address


@pytest.mark.parametrize("password", ["123456", '"quoted"', "true", "'abc'", "1e5", "2024-01-01"])
def test_password_is_taken_verbatim_from_env_and_flags(password):
    # KRILL_KEYSTORE__PASSWORD is the recommended way to give the password: a value that reads as
    # TOML (a number, a boolean, a quoted string) is still the password the user typed.
    from_env = load_config(None, environ={"KRILL_KEYSTORE__PASSWORD": password})
    from_flag = load_config(None, [f"keystore.password={password}"], environ={})
    assert from_env.keystore.password.get_secret_value() == password
    assert from_flag.keystore.password.get_secret_value() == password


def test_overrides_are_typed_by_their_field():
    cfg = load_config(None, ["worker.shards=[0, 2]", "explorer.use_store=false", "chain.request_timeout_s=2.5",
                             "worker.max_contributions=16", 'chain.rpc_url="http://127.0.0.1:9"'],
                      environ={"KRILL_CHAIN__CHAIN_ID": "31337", "KRILL_EXPLORER__HOST": "0.0.0.0"})
    assert (cfg.worker.shards, cfg.explorer.use_store, cfg.chain.request_timeout_s) == ([0, 2], False, 2.5)
    assert (cfg.worker.max_contributions, cfg.chain.chain_id, cfg.explorer.host) == (16, 31337, "0.0.0.0")
    assert cfg.chain.rpc_url == "http://127.0.0.1:9"  # a TOML string literal (as `krill devnet up` writes) is unquoted


def test_store_fields_without_type_select_the_default_local_store(tmp_path):
    cfg = load_config(None, [f"store.path={tmp_path / 'flag'}"], environ={})
    assert isinstance(cfg.store, LocalStoreConfig) and cfg.store.path == tmp_path / "flag"
    cfg = load_config(None, environ={"KRILL_STORE__PATH": str(tmp_path / "env")})
    assert isinstance(cfg.store, LocalStoreConfig) and cfg.store.path == tmp_path / "env"
    with pytest.raises(ConfigError, match="path: Extra inputs"):
        load_config(None, ["store.type=kubo", "store.path=/x"], environ={})


@pytest.mark.parametrize("override, field, message", [
    ("chain.rpc_url=banana", "chain.rpc_url", "http:// or https://"),
    ("chain.rpc_url=http://", "chain.rpc_url", "with a host"),
    ("database.url=nonsense", "database.url", "sqlite:///"),
    ("database.url=mysql://h/db", "database.url", "postgresql"),
    ("worker.shards=[-5, -5]", "worker.shards", "start at 0"),
    ("worker.shards=[1, 1]", "worker.shards", "twice"),
    ("coordinator.shards=[0, 0]", "coordinator.shards", "twice"),
    ("coordinator.shards=[]", "coordinator.shards", "at least one"),
    ("explorer.page_size=500", "explorer", "page_size 500 is over max_page_size 200"),
])
def test_nonsense_values_are_refused_naming_the_key(override, field, message):
    with pytest.raises(ConfigError, match=rf"{re.escape(field)}: .*{re.escape(message)}"):
        load_config(None, [override], environ={})


@pytest.mark.parametrize("url", ["sqlite:///rel.db", "sqlite:////abs/k.db", "sqlite://", "postgresql://u@h/db",
                                 "postgresql+psycopg://krill:s3cret@db:5432/krill"])
def test_supported_database_urls_pass(url):
    assert load_config(None, [f"database.url={url}"], environ={}).database.url == url


def test_readme_config_examples_validate(tmp_path):
    # The README's configuration examples are documentation users copy: each must load as is.
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text(encoding="utf-8")
    examples = re.findall(r"^```toml\n(.*?)^```", readme, re.S | re.M)
    assert examples
    for i, text in enumerate(examples):
        path = tmp_path / f"readme-{i}.toml"
        path.write_text(text, encoding="utf-8")
        load_config(path, environ={})


def test_an_optional_field_is_cleared_by_none_or_null_and_a_password_stays_verbatim():
    """TOML has no null: `worker.max_per_version` ("None: no limit") could not be set to None at all."""
    cfg = load_config(None, ["worker.max_per_version=none", "keystore.password=none"],
                      environ={"KRILL_CHAIN__CONFIRMATIONS": "null"})
    assert cfg.worker.max_per_version is None and cfg.chain.confirmations is None
    assert cfg.keystore.password.get_secret_value() == "none"
    assert load_config(None, ["worker.max_per_version=3"], environ={}).worker.max_per_version == 3
