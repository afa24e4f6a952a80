"""The persistent local devnet behind `krill devnet up|down|status`.

Design decisions:
- State lives in one directory ($KRILL_HOME/devnet): `devnet.json` (pid, port, chain id, contract
  addresses, deploy block), `anvil.log`, and `config.toml`, a full Krill configuration pointing at
  this devnet that later commands pick up by default.
- A devnet is "running" only if its recorded PID is alive AND its RPC answers with the recorded
  chain id; anything else is stale state, cleaned before a fresh start.
- `up`s started at the same moment take turns on a flock (`devnet.lock`): the later ones find the
  first's devnet running instead of a port "served by a chain not started by Krill".
- Provisioning: dev account 0 deploys and administers; every dev account gets `DEVNET_FUNDING`
  stake tokens so participants can stake straight away.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from krill.atomic_file import replace_file
from krill.chain.anvil import DEFAULT_CHAIN_ID, AnvilProcess, pid_alive, rpc_ready, stop_pid
from krill.errors import DevnetError
from krill.file_lock import taking_turns

DEVNET_ACCOUNTS = 20
DEVNET_FUNDING = 100_000 * 10**18
# A devnet mines one block per transaction, so block counts race ahead of wall time: a long
# unbonding period leaves room for challenge windows of a few thousand blocks.
DEVNET_UNBONDING_BLOCKS = 50_000


@dataclass(frozen=True)
class DevnetState:
    pid: int
    port: int
    chain_id: int
    protocol_address: str
    token_address: str
    deploy_block: int
    config_path: str

    @property
    def rpc_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def to_json(self) -> dict:
        return asdict(self) | {"rpc_url": self.rpc_url}


def _state_file(state_dir: Path) -> Path:
    return state_dir / "devnet.json"


def read_state(state_dir: Path) -> DevnetState | None:
    """The recorded devnet, or None when nothing is recorded."""
    path = _state_file(state_dir)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        data.pop("rpc_url", None)
        state = DevnetState(**data)
        for name, kind in (("pid", int), ("port", int), ("chain_id", int), ("deploy_block", int),
                           ("protocol_address", str), ("token_address", str), ("config_path", str)):
            if type(getattr(state, name)) is not kind:
                raise ValueError(f"{name} is not a{'n int' if kind is int else ' string'}")
        return state
    except (ValueError, TypeError) as exc:
        raise DevnetError(f"devnet state {path} is damaged ({exc}); run `krill devnet down`") from None


def is_running(state: DevnetState) -> bool:
    return pid_alive(state.pid) and rpc_ready(state.rpc_url) == state.chain_id


def provision(rpc_url: str, accounts: int = DEVNET_ACCOUNTS, funding: int = DEVNET_FUNDING):
    """Deploy the contracts with dev account 0 and mint `funding` tokens to the dev accounts."""
    from krill.chain.deploy import deploy, fund_accounts
    from krill.chain.rpc import connect_http, dev_accounts

    w3 = connect_http(rpc_url)
    devs = dev_accounts(accounts)
    deployment = deploy(w3, devs[0], unbonding_blocks=DEVNET_UNBONDING_BLOCKS)
    fund_accounts(w3, deployment, devs[0], [a.address for a in devs], funding)
    return deployment


def start_devnet(state_dir: Path, port: int = 8545) -> tuple[DevnetState, bool]:
    """Start (or find running) the devnet; returns its state and whether it was started now.

    Starts take turns on `state_dir/devnet.lock` (flock, released with the process): two `up`s at once both found
    no devnet, and the second was told the port served 'a chain not started by Krill' (the first's, mid-start),
    that its own Anvil had exited, or took the first's Anvil for its own and deployed on it beside the first
    ('nonce too low'); it now waits for the first and finds its devnet running."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with taking_turns(state_dir / "devnet.lock"):
        return _start_devnet_locked(state_dir, port)


def _start_devnet_locked(state_dir: Path, port: int) -> tuple[DevnetState, bool]:
    from krill.config import KrillConfig, write_config

    state = read_state(state_dir)
    if state is not None:
        if is_running(state):
            return state, False
        stop_devnet(state_dir)
    if rpc_ready(f"http://127.0.0.1:{port}") is not None:
        raise DevnetError(f"port {port} is already serving a chain not started by Krill; use --port")
    state_dir.mkdir(parents=True, exist_ok=True)
    node = AnvilProcess.start(port, log_path=state_dir / "anvil.log", detach=True)
    try:
        deployment = provision(node.rpc_url)
        config_path = state_dir / "config.toml"
        # The devnet's own settings on the defaults, nothing else: not the operator's config (KRILL_CONFIG,
        # whose keystore password and database URL then sat in this file, and whose devnet commands wrote
        # into that database), not the environment.
        config = KrillConfig.model_validate({"chain": {
            "rpc_url": node.rpc_url, "chain_id": deployment.chain_id, "protocol_address": deployment.protocol,
            "token_address": deployment.token, "deploy_block": deployment.block_number}})
        write_config(config, config_path)
        state = DevnetState(pid=node.pid, port=node.port, chain_id=DEFAULT_CHAIN_ID,
                            protocol_address=deployment.protocol, token_address=deployment.token,
                            deploy_block=deployment.block_number, config_path=str(config_path))
        _write_state(state_dir, state)
    except BaseException:  # no state file: nothing else would ever stop this detached node
        node.stop()
        raise
    return state, True


def _write_state(state_dir: Path, state: DevnetState) -> None:
    """Write devnet.json whole or not at all (a torn file used to lock `down` out with 'damaged')."""
    replace_file(_state_file(state_dir), json.dumps(state.to_json(), indent=1), mode=0o644)


def stop_devnet(state_dir: Path) -> bool:
    """Stop the recorded devnet (by PID) and remove its state; True if a node was stopped. A damaged state
    file names no node to stop: it is removed (so `up` can start again), and the error says so."""
    try:
        state = read_state(state_dir)
    except DevnetError as exc:
        for name in ("devnet.json", "config.toml"):
            (state_dir / name).unlink(missing_ok=True)
        raise DevnetError(f"{exc.args[0].split('; run')[0]}: removed it; if its Anvil still runs, stop it by hand "
                          f"(its log: {state_dir / 'anvil.log'})") from None
    stopped = False
    if state is not None and pid_alive(state.pid):
        if not _is_anvil(state.pid):  # the pid was reused (a reboot): never signal a process that is not Anvil
            raise DevnetError(f"recorded devnet pid {state.pid} is no longer Anvil; remove {state_dir} by hand")
        stop_pid(state.pid)
        stopped = True
    for name in ("devnet.json", "config.toml"):
        (state_dir / name).unlink(missing_ok=True)
    return stopped


PROC = Path("/proc")


def _is_anvil(pid: int) -> bool:
    """Whether process `pid` runs Anvil: its command line from /proc, or from `ps` where there is no /proc
    (macOS), where `down` used to refuse every devnet as "no longer Anvil"."""
    if PROC.is_dir():
        try:
            return "anvil" in (PROC / str(pid) / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return False
    import subprocess

    try:
        shown = subprocess.run(["ps", "-p", str(pid), "-o", "command="], capture_output=True, timeout=10,
                               check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "anvil" in shown.stdout.decode(errors="replace")


def devnet_status(state_dir: Path) -> dict:
    """Whether the devnet runs, with its addresses and latest block."""
    state = read_state(state_dir)
    if state is None or not is_running(state):
        return {"running": False}
    from krill.chain.rpc import connect_http

    return {"running": True, **state.to_json(), "block_number": connect_http(state.rpc_url).eth.block_number}
