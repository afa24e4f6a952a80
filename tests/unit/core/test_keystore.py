import json
import os
import threading

import pytest
from nacl.signing import VerifyKey

from krill.errors import KeystoreError, WrongPasswordError
from krill.keystore import KdfCost, create_keystore, list_keystores, read_info, resolve_keystore, unlock


def test_create_unlock_sign(tmp_path):
    info = create_keystore("w1", "pw", directory=tmp_path, cost=KdfCost.FAST)
    assert (os.stat(info.path).st_mode & 0o777) == 0o600
    ident = unlock(info.path, "pw")
    assert ident.address == info.address
    sig = ident.signing_key.sign(b"digest").signature
    VerifyKey(bytes.fromhex(info.ed25519_public_key)).verify(b"digest", sig)
    doc = json.loads(info.path.read_text())
    assert doc["ethereum"]["version"] == 3 and "pw" not in info.path.read_text()


def test_wrong_password_is_clear(tmp_path):
    info = create_keystore("w1", "pw", directory=tmp_path, cost=KdfCost.FAST)
    with pytest.raises(WrongPasswordError, match="wrong password"):
        unlock(info.path, "nope")


def test_import_known_private_key_and_seed(tmp_path):
    key = bytes.fromhex("ac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80")
    info = create_keystore("dev0", "pw", directory=tmp_path, private_key=key, ed25519_seed=b"\x01" * 32,
                           cost=KdfCost.FAST)
    assert info.address == "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"
    assert unlock(info.path, "pw").signing_key.encode() == b"\x01" * 32


def test_refuses_overwrite_bad_names_and_empty_password(tmp_path):
    create_keystore("w1", "pw", directory=tmp_path, cost=KdfCost.FAST)
    with pytest.raises(KeystoreError, match="already exists"):
        create_keystore("w1", "pw", directory=tmp_path, cost=KdfCost.FAST)
    with pytest.raises(KeystoreError, match="key name"):
        create_keystore("../evil", "pw", directory=tmp_path, cost=KdfCost.FAST)
    with pytest.raises(KeystoreError, match="empty password"):
        create_keystore("w2", "", directory=tmp_path, cost=KdfCost.FAST)



def test_same_name_created_at_once_keeps_one_key(tmp_path):
    """Keystores of one name created at the same moment: one is made, the others refused, and the file on
    disk holds the key the one reported (the last rename used to replace keys already reported as made)."""
    def create(folder, start, results):
        start.wait()
        try:
            results.append(create_keystore("w", "pw", directory=folder, cost=KdfCost.FAST).address)
        except KeystoreError as exc:
            results.append(str(exc))

    for attempt in range(10):
        folder, start, results = tmp_path / str(attempt), threading.Barrier(6), []
        threads = [threading.Thread(target=create, args=(folder, start, results)) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        made = [r for r in results if r.startswith("0x")]
        assert len(made) == 1 and read_info(folder / "w.json").address == made[0]
        assert all("already exists" in r for r in results if r not in made)
        assert [p.name for p in folder.iterdir()] == ["w.json"]  # no temporary file left
        assert unlock(folder / "w.json", "pw").address == made[0]


def test_a_file_system_without_hard_links_still_makes_one_keystore(tmp_path, monkeypatch):
    """FAT/exFAT (a Mac's external drive) and some network shares refuse link() with EPERM or ENOTSUP: the
    keystore is then created exclusively, still never over an existing one."""
    def no_links(src, dst):
        raise PermissionError(1, "Operation not permitted", str(dst))

    monkeypatch.setattr(os, "link", no_links)
    info = create_keystore("w", "pw", directory=tmp_path, cost=KdfCost.FAST)
    assert unlock(info.path, "pw").address == info.address
    assert (info.path.stat().st_mode & 0o777) == 0o600
    with pytest.raises(KeystoreError, match="already exists"):
        create_keystore("w", "pw", directory=tmp_path, cost=KdfCost.FAST)
    assert [p.name for p in tmp_path.iterdir()] == ["w.json"] and unlock(info.path, "pw").address == info.address


def test_tampered_public_fields_detected(tmp_path):
    info = create_keystore("w1", "pw", directory=tmp_path, cost=KdfCost.FAST)
    doc = json.loads(info.path.read_text())
    doc["ed25519_public_key"] = "00" * 32
    info.path.write_text(json.dumps(doc))
    with pytest.raises(KeystoreError, match="do not match"):
        unlock(info.path, "pw")


def test_resolve_and_list(tmp_path):
    with pytest.raises(KeystoreError, match="no keystore"):
        resolve_keystore(None, tmp_path)
    a = create_keystore("a", "pw", directory=tmp_path, cost=KdfCost.FAST)
    assert resolve_keystore(None, tmp_path) == a.path
    create_keystore("b", "pw", directory=tmp_path, cost=KdfCost.FAST)
    with pytest.raises(KeystoreError, match="2 keystores"):
        resolve_keystore(None, tmp_path)
    assert resolve_keystore("b", tmp_path).name == "b.json"
    assert [i.name for i in list_keystores(tmp_path)] == ["a", "b"]
    (tmp_path / "junk.json").write_text("{}")  # a wallet export, say: skipped, not an error for every key command
    assert [i.name for i in list_keystores(tmp_path)] == ["a", "b"]
    with pytest.raises(KeystoreError, match="not a Krill keystore"):
        read_info(tmp_path / "junk.json")
    (tmp_path / "b.json").unlink()
    assert resolve_keystore(None, tmp_path) == a.path  # still the only keystore there is


@pytest.mark.parametrize("field, value", [("ed25519_public_key", 5), ("address", None), ("name", ["x"])])
def test_keys_list_skips_a_keystore_whose_public_fields_are_not_strings(tmp_path, field, value):
    """Before: `krill keys list` died with a TypeError traceback (`ed25519_public_key[:16]` of an int) on such a
    file, though damaged keystores are meant to be skipped with a warning."""
    from click.testing import CliRunner

    from krill.cli import cli

    good = create_keystore("good", "pw", directory=tmp_path, cost=KdfCost.FAST)
    doc = json.loads(good.path.read_text())
    doc[field] = value
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(KeystoreError, match=f"the field '{field}' is not a string"):
        read_info(tmp_path / "bad.json")
    assert [i.path for i in list_keystores(tmp_path)] == [good.path]
    result = CliRunner().invoke(cli, ["keys", "list", "--dir", str(tmp_path)], env={"KRILL_CONFIG": None})
    assert result.exit_code == 0 and "good" in result.output and result.exception is None, result.output


@pytest.mark.parametrize("version", [99, "3", None])
def test_unsupported_ethereum_keystore_version_is_a_keystore_error(tmp_path, version):
    # eth-keyfile raises NotImplementedError for a version other than 3 or 4: it escaped `unlock` as a traceback
    # out of every command that opens the keystore (`krill worker claim`, `krill keys show --unlock`).
    info = create_keystore("w1", "pw", directory=tmp_path, cost=KdfCost.FAST)
    doc = json.loads(info.path.read_text())
    doc["ethereum"]["version"] = version
    info.path.write_text(json.dumps(doc))
    with pytest.raises(KeystoreError, match=rf"{info.path}: malformed ethereum section \(unsupported keystore version"):
        unlock(info.path, "pw")
