"""Start and stop a pinned Anvil node, tracked by PID.

Design decisions:
- The binary is the platform package's own (`node_modules/@foundry-rs/anvil-<platform>/bin/anvil`),
  started directly: the npx wrapper leaves its child running when killed.
- Anvil is bound to 127.0.0.1 only. A free port is picked by binding port 0 when none is given.
- Readiness is polled (eth_chainId) with a deadline, not slept for.
- `AnvilProcess` stops only the process it started (by PID, SIGTERM then SIGKILL); it is a context
  manager so tests and the demo never leak nodes.
- `--prune-history 32`: Anvil otherwise writes the state of old blocks to ~/.foundry/anvil/tmp
  and leaves it there when stopped (8 GB after one 400-version demo; 73 GB had piled up on the
  development machine and filled its disk). Krill reads events and the latest state only, never
  state at an old block; blocks, receipts and logs are kept. The 32 newest states stay in memory:
  with none kept, a call for `latest` raced the next block ("block height is 207 but requested
  was 206") and stopped the demo's coordinator.
- The node's default mnemonic gives funded dev accounts; `DEV_MNEMONIC` is Anvil's well-known one,
  public on purpose: devnets only.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from krill.errors import DevnetError

DEV_MNEMONIC = "test test test test test test test test test test test junk"
DEFAULT_CHAIN_ID = 31337


def project_root() -> Path:
    """The source checkout (where package.json and node_modules live)."""
    return Path(__file__).resolve().parents[2]


def anvil_binary() -> Path:
    """Path of the pinned Anvil binary, or a DevnetError saying how to install it."""
    env = os.environ.get("KRILL_ANVIL")
    if env:
        return Path(env)
    machine = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine().lower())
    system = platform.system().lower()
    candidate = project_root() / "node_modules" / "@foundry-rs" / f"anvil-{system}-{machine}" / "bin" / "anvil"
    if not candidate.exists():
        raise DevnetError(f"Anvil binary not found at {candidate}: run `make setup` (npm ci) or set KRILL_ANVIL")
    return candidate


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rpc_ready(url: str, timeout: float = 0.5) -> int | None:
    """The chain id answered at `url`, or None if nothing answers."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return int(json.loads(resp.read())["result"], 16)
    except (OSError, ValueError, KeyError):
        return None


@dataclass
class AnvilProcess:
    """A running Anvil node started by this process."""

    pid: int
    port: int
    log_path: Path | None = None
    _popen: subprocess.Popen | None = None

    @property
    def rpc_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, port: int | None = None, *, chain_id: int = DEFAULT_CHAIN_ID, accounts: int = 20,
              balance_eth: int = 10_000, block_time: float | None = None, log_path: Path | None = None,
              detach: bool = False, ready_timeout: float = 20.0) -> AnvilProcess:
        """Start Anvil and wait until it answers. `detach` puts it in its own session (for `devnet up`)."""
        port = port or free_port()
        args = [str(anvil_binary()), "--host", "127.0.0.1", "--port", str(port), "--chain-id", str(chain_id),
                "--accounts", str(accounts), "--balance", str(balance_eth), "--mnemonic", DEV_MNEMONIC,
                "--hardfork", "prague", "--prune-history", "32"]
        if block_time is not None:
            args += ["--block-time", str(block_time)]
        if log_path is None:
            args.append("--silent")
            out = subprocess.DEVNULL
        else:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            out = open(log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            popen = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=detach)
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        node = cls(pid=popen.pid, port=port, log_path=log_path, _popen=popen)
        deadline = time.monotonic() + ready_timeout
        try:
            while time.monotonic() < deadline:
                if popen.poll() is not None:
                    raise DevnetError(f"Anvil exited with status {popen.returncode} on port {port}"
                                      + (f"; see {log_path}" if log_path else ""))
                if rpc_ready(node.rpc_url) == chain_id:
                    return node
                time.sleep(0.05)
        except BaseException:  # Ctrl-C while it starts: a detached node would outlive us, unrecorded
            node.stop()
            raise
        node.stop()
        raise DevnetError(f"Anvil did not answer on {node.rpc_url} within {ready_timeout:.0f}s")

    def alive(self) -> bool:
        if self._popen is not None:
            return self._popen.poll() is None
        return pid_alive(self.pid)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the node this object started (SIGTERM, then SIGKILL after `timeout`)."""
        stop_pid(self.pid, timeout, self._popen)

    def __enter__(self) -> AnvilProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs; reaps it first if it is an exited child of ours (no zombie counts as alive)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_pid(pid: int, timeout: float = 5.0, popen: subprocess.Popen | None = None) -> None:
    """Terminate one process by PID and reap it if it is our child.

    With `popen` (the child's own), a child it has already reaped is left alone, as `Popen.send_signal`
    does: its PID may since belong to another process. Unreaped, the PID stays ours, even as a zombie."""
    if popen is not None and popen.poll() is not None:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if popen is not None:
            if popen.poll() is not None:
                return
        elif not pid_alive(pid):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    if popen is not None:
        popen.wait(timeout)
