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
    ("store.type=kubo;store.api_url=notaurl", "store.api_url", "http:// or https://"),
    ("store.type=kubo;store.api_url=ftp://h:5001", "store.api_url", "e.g. http://127.0.0.1:5001"),
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
        load_config(None, override.split(";"), environ={})


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


def test_a_config_file_that_cannot_be_read_or_decoded_is_a_config_error(tmp_path):
    """Before: a path through a file (or one without read permission) and a non-UTF-8 file escaped as
    NotADirectoryError / UnicodeDecodeError tracebacks from every command."""
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe[chain]\n")
    with pytest.raises(ConfigError, match=r"binary\.toml is not valid TOML: not UTF-8"):
        load_config(binary, environ={})
    through_a_file = tmp_path / "binary.toml" / "x.toml"
    with pytest.raises(ConfigError, match=r"x\.toml cannot be read: Not a directory"):
        load_config(through_a_file, environ={})


def test_an_invalid_override_is_blamed_on_the_override_not_the_file(tmp_path):
    """Before: `--config good.toml --set worker.threads=0` said "invalid configuration in good.toml:
    worker.threads ..." though the file is fine, and a bad KRILL_* variable was blamed on the file too."""
    good = tmp_path / "good.toml"
    good.write_text("[worker]\nthreads = 2\n")
    with pytest.raises(ConfigError) as flag:
        load_config(good, ["worker.threads=0"], environ={})
    assert "good.toml" not in str(flag.value)
    assert re.search(r"worker\.threads: .*greater than or equal to 1 \(from --set worker\.threads\)", str(flag.value))
    with pytest.raises(ConfigError) as env:
        load_config(good, environ={"KRILL_WORKER__THREADS": "four", "KRILL_FOO__BAR": "1"})
    assert "good.toml" not in str(env.value)
    assert "worker.threads: Input should be a valid integer" in str(env.value)
    assert "(from environment variable KRILL_WORKER__THREADS)" in str(env.value)
    assert "foo: Extra inputs are not permitted (from environment variable KRILL_FOO__BAR)" in str(env.value)
    bad = tmp_path / "bad.toml"
    bad.write_text('[worker]\nthreads = 0\n[store]\ntype = "kubo"\npath = "/x"\n')
    with pytest.raises(ConfigError) as in_file:
        load_config(bad, ["chain.retries=-1"], environ={})
    text = str(in_file.value)
    assert text.startswith(f"invalid configuration in {bad}: ")
    # The key as the file spells it (pydantic's own location is store.kubo.path).
    problems = set(text.split(": ", 1)[1].split("; "))
    assert problems == {"store.path: Extra inputs are not permitted",
                        "worker.threads: Input should be greater than or equal to 1",
                        "chain.retries: Input should be greater than or equal to 0 (from --set chain.retries)"}


def test_an_override_that_changes_the_store_type_replaces_the_files_store_section(tmp_path):
    """Before: every config `krill devnet up` writes has `[store] type = "local"` and `path`, and
    `KRILL_STORE__TYPE=kubo` (or `--set store.type=kubo`) failed on it with "store.kubo.path: Extra inputs
    are not permitted": no override could point such a deployment at a Kubo store."""
    local = tmp_path / "local.toml"
    local.write_text(f'[store]\ntype = "local"\npath = "{tmp_path / "s"}"\nmax_get_bytes = 7\n')
    env = {"KRILL_STORE__API_URL": "http://kubo:5001", "KRILL_STORE__TYPE": "kubo"}  # sorted: the URL comes first
    cfg = load_config(local, environ=env)
    assert isinstance(cfg.store, KuboStoreConfig) and cfg.store.api_url == "http://kubo:5001"
    assert cfg.store.max_get_bytes == 1 << 30  # the file's local settings do not carry over
    cfg = load_config(local, ["store.type=kubo", "store.timeout_s=5"], environ={})
    assert isinstance(cfg.store, KuboStoreConfig) and cfg.store.timeout_s == 5
    # The same type keeps the file's settings; a file without a store section takes the override as is.
    cfg = load_config(local, ["store.type=local", "store.max_get_bytes=9"], environ={})
    assert (cfg.store.path, cfg.store.max_get_bytes) == (tmp_path / "s", 9)
    # Within one layer, settings of the wrong type are still refused.
    with pytest.raises(ConfigError, match="store.path: Extra inputs"):
        load_config(local, ["store.type=kubo", "store.path=/x"], environ={})
    with pytest.raises(ConfigError, match=r"chain\.type: Extra inputs .*\(from --set chain\.type\)"):
        load_config(local, ["chain.type=kubo"], environ={})
