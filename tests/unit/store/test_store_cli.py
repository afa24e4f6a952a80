"""`krill store ...` and `krill bench store` through click, against the local store."""

import json

from click.testing import CliRunner

from krill.commands.bench_store import run_bench
from krill.commands.bench_store import store as bench_store
from krill.commands.store_cmd import store


def _invoke(cmd, args, tmp_path, **kwargs):
    obj = {"config_path": None, "overrides": ("store.type=local", f"store.path={json.dumps(str(tmp_path / 'st'))}")}
    return CliRunner().invoke(cmd, args, obj=obj, catch_exceptions=False, **kwargs)


def test_add_cat_get_pin(tmp_path):
    path = tmp_path / "hello.txt"
    path.write_bytes(b"hello world\n")
    result = _invoke(store, ["add", str(path), "--pin"], tmp_path)
    assert result.output.strip() == "bafkreifjjcie6lypi6ny7amxnfftagclbuxndqonfipmb64f2km2devei4"
    assert _invoke(store, ["cat", result.output.strip()], tmp_path).stdout_bytes == b"hello world\n"
    out = tmp_path / "out.bin"
    _invoke(store, ["get", result.output.strip(), "-o", str(out)], tmp_path)
    assert out.read_bytes() == b"hello world\n"
    assert _invoke(store, ["unpin", result.output.strip()], tmp_path).exit_code == 0


def test_bench_reports_every_figure():
    results = run_bench(size_mb=2, repeats=1)
    for name in ("store_put_mb_s", "store_get_verified_mb_s", "ed25519_sign_per_s", "ed25519_verify_per_s",
                 "validate_contribution_ms"):
        assert results[name] > 0
    assert 20_000 < results["contribution_masked_values"] < 30_000
    printed = CliRunner().invoke(bench_store, ["--size-mb", "1", "--repeats", "1", "--json"])
    assert printed.exit_code == 0, printed.output
    assert set(json.loads(printed.output)) == set(results)


def test_content_nobody_stored_is_one_unquoted_error_line(tmp_path):
    """Before: `ContentNotFoundError` is a `KeyError`, whose str is its argument's repr, so the line read
    "error: 'bafk... is not in the local store ...'", quotes and escaped characters included."""
    from krill.cli import cli
    from krill.store.cid import file_cid

    cid = file_cid(b"nobody stored this")
    result = CliRunner().invoke(cli, ["--set", "store.type=local", "--set", f"store.path={tmp_path / 'st'}",
                                       "store", "cat", cid])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: {cid} ") and "'" not in result.stderr.splitlines()[0]


def test_put_block_of_a_file_over_one_block_points_at_add(tmp_path):
    """Before: the store's refusal ended "(use add() for larger content)", a Python method, not a command."""
    from krill.cli import cli
    from krill.store.cid import MAX_BLOCK_SIZE

    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * (MAX_BLOCK_SIZE + 1))
    result = CliRunner().invoke(cli, ["--set", "store.type=local", "--set", f"store.path={tmp_path / 'st'}",
                                      "store", "put-block", str(big)])
    assert result.exit_code == 2
    assert f"{big} is {MAX_BLOCK_SIZE + 1} bytes; one raw block holds at most {MAX_BLOCK_SIZE}: store it with " \
           f"`krill store add {big}`" in " ".join(result.stderr.split())
