"""Encrypted keystores: one file per participant holding both of its keys.

Design decisions:
- The Ethereum account is stored as a standard keystore v3 object (eth-account), so any Ethereum
  wallet can open it. The Ed25519 seed that signs payload headers is sealed with a key derived from
  the same password by Argon2id (libsodium via pynacl) and XSalsa20-Poly1305 (SecretBox).
- One JSON file `{"krill_keystore": 1, "name", "address", "ed25519_public_key", "ethereum": {...},
  "ed25519": {...}}`, written atomically with mode 0600, and never over an existing one unless asked
  (`overwrite`), even when two processes create the same name at once; public fields are readable without the
  password so `krill keys list/show` never asks for it.
- KDF cost is a parameter: interactive defaults for people, cheaper settings for tests and devnets
  (`KdfCost.FAST`), recorded in the file so opening always uses what sealing used.
- A wrong password raises `WrongPasswordError`; a damaged file raises `KeystoreError` naming the path.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from krill.config import krill_home
from krill.errors import KeystoreError, WrongPasswordError

FORMAT_VERSION = 1


class KdfCost(Enum):
    """Password-hashing cost: (scrypt n for keystore v3, argon2 opslimit, argon2 memlimit)."""

    INTERACTIVE = (1 << 18, 2, 64 * 1024 * 1024)
    FAST = (1 << 10, 1, 8 * 1024)


@dataclass(frozen=True)
class Identity:
    """An unlocked participant: the Ethereum account and the Ed25519 signing key."""

    name: str
    account: object  # eth_account LocalAccount (imported lazily)
    signing_key: object  # nacl.signing.SigningKey

    @property
    def address(self) -> str:
        return self.account.address

    @property
    def ed25519_public_key(self) -> bytes:
        return bytes(self.signing_key.verify_key)


@dataclass(frozen=True)
class KeystoreInfo:
    """The public part of a keystore file."""

    name: str
    path: Path
    address: str
    ed25519_public_key: str


def keys_dir() -> Path:
    return krill_home() / "keys"


def _check_name(name: str) -> None:
    if not name or len(name) > 64 or not all(c.isalnum() or c in "-_." for c in name) or name.startswith("."):
        raise KeystoreError(f"key name {name!r} must be 1-64 letters, digits, '-', '_' or '.'")


def _seal_seed(seed: bytes, password: str, cost: KdfCost) -> dict:
    import nacl.pwhash
    import nacl.secret
    import nacl.utils

    _, ops, mem = cost.value
    salt = nacl.utils.random(nacl.pwhash.argon2id.SALTBYTES)
    key = nacl.pwhash.argon2id.kdf(nacl.secret.SecretBox.KEY_SIZE, password.encode(), salt, opslimit=ops, memlimit=mem)
    sealed = nacl.secret.SecretBox(key).encrypt(seed)
    return {"cipher": "xsalsa20-poly1305", "kdf": "argon2id", "opslimit": ops, "memlimit": mem,
            "salt": salt.hex(), "sealed": bytes(sealed).hex()}


def _open_seed(box: dict, password: str, path: Path) -> bytes:
    import nacl.exceptions
    import nacl.pwhash
    import nacl.secret

    try:
        if box["kdf"] != "argon2id" or box["cipher"] != "xsalsa20-poly1305":
            raise KeystoreError(f"{path}: unsupported ed25519 sealing {box['kdf']}/{box['cipher']}")
        key = nacl.pwhash.argon2id.kdf(nacl.secret.SecretBox.KEY_SIZE, password.encode(), bytes.fromhex(box["salt"]),
                                       opslimit=int(box["opslimit"]), memlimit=int(box["memlimit"]))
        sealed = bytes.fromhex(box["sealed"])
    except (KeyError, ValueError, TypeError) as exc:
        raise KeystoreError(f"{path}: malformed ed25519 section ({exc})") from None
    try:
        return nacl.secret.SecretBox(key).decrypt(sealed)
    except nacl.exceptions.CryptoError:
        raise WrongPasswordError(f"wrong password for keystore {path}") from None


def _publish_new(tmp: Path, path: Path) -> None:
    """Give the written file `tmp` the name `path`, which must not exist (FileExistsError): link(), atomic.
    A file system without hard links (FAT or exFAT, some network shares) refuses link() with another
    OSError; there the name is created exclusively (O_EXCL) and the bytes copied in."""
    try:
        os.link(tmp, path)
        return
    except FileExistsError:
        raise
    except OSError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(tmp.read_bytes())


def create_keystore(name: str, password: str, *, directory: Path | None = None, private_key: bytes | None = None,
                    ed25519_seed: bytes | None = None, cost: KdfCost = KdfCost.INTERACTIVE,
                    overwrite: bool = False) -> KeystoreInfo:
    """Create a keystore file with a new (or the given) Ethereum key and Ed25519 seed."""
    from eth_account import Account
    from nacl.signing import SigningKey

    _check_name(name)
    if not password:
        raise KeystoreError("an empty password is not allowed")
    directory = directory or keys_dir()
    path = directory / f"{name}.json"
    if path.exists() and not overwrite:
        raise KeystoreError(f"keystore {path} already exists (choose another --name)")
    account = Account.from_key(private_key) if private_key is not None else Account.create()
    seed = ed25519_seed if ed25519_seed is not None else os.urandom(32)
    if len(seed) != 32:
        raise KeystoreError("an Ed25519 seed is 32 bytes")
    signing_key = SigningKey(seed)
    scrypt_n, _, _ = cost.value
    doc = {
        "krill_keystore": FORMAT_VERSION,
        "name": name,
        "address": account.address,
        "ed25519_public_key": bytes(signing_key.verify_key).hex(),
        "ethereum": Account.encrypt(account.key, password, kdf="scrypt", iterations=scrypt_n),
        "ed25519": _seal_seed(seed, password, cost),
    }
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    # A temporary name of this call's own (created 0600), published with link(), which fails if the name
    # exists: two `init`s making one keystore at once both passed the check above, and the one renaming last
    # replaced the other's key (which that one had already reported, and funded), or found their shared
    # temporary file renamed away.
    fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)
        if overwrite:
            tmp.replace(path)
        else:
            try:
                _publish_new(tmp, path)
            except FileExistsError:
                raise KeystoreError(f"keystore {path} already exists (choose another --name)") from None
    finally:
        tmp.unlink(missing_ok=True)
    return KeystoreInfo(name, path, account.address, doc["ed25519_public_key"])


def _read(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise KeystoreError(f"keystore {path} does not exist (create one with `krill keys new`)") from None
    except (OSError, ValueError) as exc:
        raise KeystoreError(f"keystore {path} is unreadable: {exc}") from None
    if not isinstance(doc, dict) or doc.get("krill_keystore") != FORMAT_VERSION:
        raise KeystoreError(f"{path} is not a Krill keystore (format {FORMAT_VERSION})")
    for field in ("name", "address", "ed25519_public_key", "ethereum", "ed25519"):
        if field not in doc:
            raise KeystoreError(f"keystore {path} lacks the field '{field}'")
    # The public fields are read without the password (`krill keys list/show`): of the wrong type, the file
    # is damaged, and `list_keystores` skips it with a warning instead of the listing failing on it.
    for field in ("name", "address", "ed25519_public_key"):
        if not isinstance(doc[field], str):
            raise KeystoreError(f"keystore {path}: the field '{field}' is not a string")
    return doc


def read_info(path: Path) -> KeystoreInfo:
    """Public fields of a keystore file; needs no password."""
    doc = _read(path)
    return KeystoreInfo(doc["name"], path, doc["address"], doc["ed25519_public_key"])


def list_keystores(directory: Path | None = None) -> list[KeystoreInfo]:
    """The Krill keystores in `directory`; other JSON files there (a wallet export, say) are skipped with a
    warning, not an error that made every key command fail."""
    directory = directory or keys_dir()
    if not directory.is_dir():
        return []
    found = []
    for path in sorted(directory.glob("*.json")):
        try:
            found.append(read_info(path))
        except KeystoreError as exc:
            logging.getLogger(__name__).warning("skipping %s: %s", path, exc)
    return found


def resolve_keystore(path_or_name: str | Path | None, directory: Path | None = None) -> Path:
    """A keystore path from a path, a name in the keys directory, or the only keystore there is."""
    directory = directory or keys_dir()
    if path_or_name:
        candidate = Path(path_or_name).expanduser()
        if candidate.suffix == ".json" or candidate.exists():
            return candidate
        return directory / f"{path_or_name}.json"
    found = list_keystores(directory)
    if len(found) == 1:
        return found[0].path
    if not found:
        raise KeystoreError(f"no keystore in {directory}: create one with `krill keys new`")
    raise KeystoreError(f"{len(found)} keystores in {directory}: choose one with keystore.path "
                        "(`--set keystore.path=NAME`, or `[keystore] path` in the config)")


def unlock(path: Path, password: str) -> Identity:
    """Open a keystore with its password."""
    from eth_account import Account
    from nacl.signing import SigningKey

    doc = _read(path)
    if not isinstance(doc.get("ethereum"), dict):  # eth-keyfile's own words ("The keyfile should be ...") read badly
        found = "missing" if doc.get("ethereum") is None else f"a {type(doc['ethereum']).__name__}"
        raise KeystoreError(f"keystore {path}: malformed ethereum section ({found}; expected the JSON object of an "
                            "Ethereum keystore, version 3)")
    try:
        private_key = Account.decrypt(doc["ethereum"], password)
    except ValueError as exc:
        if "MAC mismatch" in str(exc):
            raise WrongPasswordError(f"wrong password for keystore {path}") from None
        raise KeystoreError(f"keystore {path}: malformed ethereum section ({exc})") from None
    except (KeyError, TypeError, AttributeError) as exc:  # a section missing its fields
        raise KeystoreError(f"keystore {path}: malformed ethereum section (missing or wrong {exc})") from None
    except NotImplementedError:  # eth-keyfile reads versions 3 and 4 only; any other escaped as a traceback
        version = doc["ethereum"].get("version") if isinstance(doc["ethereum"], dict) else None
        raise KeystoreError(f"keystore {path}: malformed ethereum section (unsupported keystore version "
                            f"{version!r}; expected 3)") from None
    account = Account.from_key(private_key)
    signing_key = SigningKey(_open_seed(doc["ed25519"], password, path))
    if account.address != doc["address"] or bytes(signing_key.verify_key).hex() != doc["ed25519_public_key"]:
        raise KeystoreError(f"keystore {path}: keys do not match the recorded public fields (file tampered?)")
    return Identity(doc["name"], account, signing_key)
