"""`krill worker init` / `krill verifier init`: a keystore and a role config that later commands use.

Design decisions:
- The chain comes either from the running devnet (`--devnet`: what `krill devnet up` recorded in
  $KRILL_HOME/devnet/devnet.json) or from `--rpc-url` + `--protocol`. Everything given is checked
  before anything is written: the chain answers (else the URL and `krill devnet status`), a
  contract is deployed at the address, the run exists on-chain and its spec is in the store (else
  "check run.id"), a Kubo store answers. A config that would fail at `stake` or `run` is never
  written.
- `--store` is a Kubo RPC URL when it starts with http:// or https://, else a local folder; another URL
  (`ipfs://...`) is refused rather than made into a folder named `ipfs:` under the current one.
- Without `--run-id`, the run is taken from the chain when it holds exactly one; with several,
  their ids are listed in the next steps instead of guessing.
- Keys are never overwritten, `--force` or not: losing a staked key loses the stake. An existing
  keystore of that name is reused once its password opens it; `--force` only replaces the config
  file. Keystores made for a devnet use the cheap KDF setting (`KdfCost.FAST`), as the keystore
  module intends for devnets; others the interactive cost.
- On a devnet a new, empty account is funded with ether (anvil_setBalance) and 1,000 stake tokens
  from the last dev account (the faucet), so `stake` works straight away. Never from dev account 0:
  it administers the devnet, and a running coordinator may send as it.
- The password is never written to the config; it comes from KRILL_KEYSTORE__PASSWORD or a prompt
  at each command. The file is still mode 0600: it names where the keys are.
- A role-neutral module: the role is a parameter, so the core serves both roles without importing
  either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from krill.config import KrillConfig, krill_home
from krill.errors import ConfigError, ContentNotFoundError, DevnetError, WrongPasswordError

DEVNET_ETHER = 100 * 10**18
DEVNET_TOKENS = 1_000 * 10**18


@dataclass
class InitResult:
    role: str
    config_path: Path
    keystore_path: Path
    address: str
    ed25519_public_key: str
    created_keystore: bool
    rpc_url: str
    run_id: str | None
    funded: list[str] = field(default_factory=list)
    other_runs: list[str] = field(default_factory=list)
    minimum: int = 0

    def next_steps(self) -> list[str]:
        role, cfg = self.role, self.config_path
        steps = [f"export KRILL_CONFIG={cfg}   (or pass `krill --config {cfg} {role} ...`)",
                 "export KRILL_KEYSTORE__PASSWORD=...   (or type it when asked)"]
        if self.run_id is None:
            listed = (": runs on this chain: " + ", ".join(self.other_runs)) if self.other_runs else \
                " (`krill coordinator create-run` prints it)"
            steps.append(f"set [run] id = \"<64 hex digits>\" in {cfg}{listed}")
        from krill.staking import tokens

        steps += [f"krill {role} stake [--amount TOKENS]   (minimum {tokens(self.minimum)} KRILL)",
                  f"krill {role} run", f"krill {role} status [--json]"]
        return steps


def keystore_path(keystore: str | None, role: str) -> tuple[Path, bool]:
    """Where the keystore is (a path, or a name in $KRILL_HOME/keys; default the role's name) and whether it exists."""
    from krill.keystore import keys_dir

    name = keystore or role
    # A bare name is a keystore in the keys directory, even if a folder of that name is in the current one.
    is_path = name.endswith(".json") or "/" in name or name.startswith("~")
    path = Path(name).expanduser().resolve() if is_path else keys_dir() / f"{name}.json"
    if path.suffix != ".json" and not path.exists():
        # A keystore is written as <name>.json: the config would name a file that is never there.
        raise ConfigError(f"--keystore {keystore}: a new keystore's path must end in .json "
                          f"(e.g. {path.with_suffix('.json')})")
    return path, path.exists()


def _devnet_chain() -> dict:
    from krill.chain.devnet import is_running, read_state

    state = read_state(krill_home() / "devnet")
    if state is None or not is_running(state):
        raise DevnetError(f"no devnet is running for KRILL_HOME={krill_home()}: start one with `krill devnet up` "
                          "(`krill devnet status` tells), or pass --rpc-url and --protocol")
    return {"rpc_url": state.rpc_url, "chain_id": state.chain_id, "protocol_address": state.protocol_address,
            "token_address": state.token_address, "deploy_block": state.deploy_block}


def _store_section(store: str | None) -> dict:
    if store is None:
        return {"type": "local", "path": str(krill_home() / "store")}
    if store.startswith(("http://", "https://")):
        return {"type": "kubo", "api_url": store}
    if "://" in store:  # `ipfs://...`, `ftp://...`: was taken as a local folder named `ipfs:` under the current one
        raise ConfigError(f"--store {store}: expected a local directory or a Kubo RPC URL (http:// or https://)")
    return {"type": "local", "path": str(Path(store).expanduser().resolve())}


def _runs(chain, from_block: int) -> list[str]:
    from krill.chain.events import RunCreated

    return [ev.run_id.hex() for ev in chain.events(from_block, kinds=(RunCreated,))]


def _check_store(config: KrillConfig, run_id: str | None) -> None:
    from krill.protocol.spec import load_spec
    from krill.runtime import open_configured_store
    from krill.store.cid import digest_to_cid

    store = open_configured_store(config)
    try:
        if run_id is None:
            store.has(digest_to_cid(b"\x00" * 32))  # reachability: a Kubo that does not answer raises here
            return
        try:
            load_spec(store, bytes.fromhex(run_id))
        except ContentNotFoundError:
            where = config.store.path if config.store.type == "local" else config.store.api_url
            raise ConfigError(f"the store at {where} does not hold the spec of run {run_id[:16]}…: point --store at "
                              "the run's store (the coordinator's), or check --run-id") from None
    finally:
        store.close()


def _fund_on_devnet(chain, address: str) -> list[str]:
    from krill.chain.devnet import DEVNET_ACCOUNTS
    from krill.chain.rpc import dev_account
    from krill.staking import StakingError, tokens

    funded = []
    if chain.ether_balance(address) == 0:
        _set_balance(chain, address)
        funded.append(f"{DEVNET_ETHER // 10**18} ETH")
    if chain.token.balance_of(address) == 0:
        # The last dev account is the faucet: dev account 0 administers the devnet (and may be a running
        # coordinator), and a transaction from it here would put its nonce out of step with that process.
        faucet = dev_account(DEVNET_ACCOUNTS - 1)
        if chain.token.balance_of(faucet.address) < DEVNET_TOKENS:
            raise StakingError(f"the devnet faucet (dev account {DEVNET_ACCOUNTS - 1}, {faucet.address}) has fewer "
                               f"than {tokens(DEVNET_TOKENS)} KRILL left to give {address}: restart the devnet "
                               "(`krill devnet down && krill devnet up`) or ask its operator for tokens")
        if chain.ether_balance(faucet.address) == 0:
            _set_balance(chain, faucet.address)
        chain.as_account(faucet).token.transfer(address, DEVNET_TOKENS)
        funded.append(f"{tokens(DEVNET_TOKENS)} KRILL")
    return funded


def _set_balance(chain, address: str) -> None:
    from krill.staking import StakingError

    answer = chain.w3.provider.make_request("anvil_setBalance", [address, hex(DEVNET_ETHER)])
    if "error" in answer:
        raise StakingError(f"could not give {address} ether on the devnet ({answer['error']})")


def init_role(role: str, *, out: Path, keystore: Path, password: str, devnet: bool = False,
              rpc_url: str | None = None, protocol: str | None = None, store: str | None = None,
              run_id: str | None = None, force: bool = False) -> InitResult:
    """Check the chain, store and run, make (or reuse) the keystore, fund it on a devnet, write the config."""
    from krill.keystore import KdfCost, create_keystore, read_info, unlock
    from krill.runtime import connect_chain
    from krill.staking import role_code

    if out.exists() and not force:
        raise ConfigError(f"{out} already exists: pass --force to replace it, or --out to write elsewhere")
    if devnet:
        if rpc_url or protocol:
            raise ConfigError("--devnet takes the chain from the running devnet: leave out --rpc-url and --protocol")
        chain_section = _devnet_chain()
    else:
        if not (rpc_url and protocol):
            raise ConfigError("say which chain: --devnet (the one `krill devnet up` started), or --rpc-url URL and "
                              "--protocol 0xADDRESS (the KrillProtocol contract)")
        chain_section = {"rpc_url": rpc_url, "protocol_address": protocol}
    run_id = run_id.removeprefix("0x").lower() if run_id else None
    data = {"chain": chain_section, "store": _store_section(store), "keystore": {"path": str(keystore)},
            "run": {"id": run_id} if run_id else {}, role: {}}
    config = _validated(data)
    chain = connect_chain(config, address_from="the devnet's protocol address" if devnet else "--protocol")
    chain_section.setdefault("chain_id", chain.w3.eth.chain_id)
    chain_section.setdefault("token_address", chain.token_address())
    others: list[str] = []
    if run_id is not None:
        from krill.account_status import check_run

        check_run(chain, bytes.fromhex(run_id))
    else:
        found = _runs(chain, config.chain.deploy_block)
        if len(found) == 1:
            run_id = found[0]
            data["run"] = {"id": run_id}
        others = found if len(found) > 1 else []
    config = _validated(data)
    _check_store(config, run_id)

    created = not keystore.exists()
    if created:
        info = create_keystore(keystore.stem, password, directory=keystore.parent,
                               cost=KdfCost.FAST if devnet else KdfCost.INTERACTIVE)
    else:
        info = read_info(keystore)
        try:
            unlock(keystore, password)  # a wrong password fails here, before anything is written
        except WrongPasswordError:
            raise WrongPasswordError(f"wrong password for the existing keystore {keystore}: give the password it was "
                                     "made with (KRILL_KEYSTORE__PASSWORD, --password-file or the prompt), or pass "
                                     "--keystore NEW_NAME to make a new one") from None
    funded = _fund_on_devnet(chain, info.address) if devnet else []
    _write(data, out, header=f"{role} configuration written by `krill {role} init`; every field: `krill config "
                             "show`; the password is not stored here (KRILL_KEYSTORE__PASSWORD)")
    return InitResult(role, out, info.path, info.address, info.ed25519_public_key, created,
                      config.chain.rpc_url, run_id, funded, others, chain.minimum_stake(role_code(role)))


def _validated(data: dict) -> KrillConfig:
    from pydantic import ValidationError

    from krill.config import describe_errors, validation_errors

    try:
        return KrillConfig.model_validate(data)
    except ValidationError as exc:  # keys as a config file spells them, without pydantic's "Value error, "
        raise ConfigError(f"invalid settings: {describe_errors(validation_errors(exc))}") from None


def _write(data: dict, path: Path, header: str) -> None:
    """TOML with a comment on top, atomically, mode 0600."""
    import tomli_w

    from krill.atomic_file import replace_file

    replace_file(path, f"# {header}\n" + tomli_w.dumps({k: v for k, v in data.items() if v}))
