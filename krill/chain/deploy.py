"""Deploy KrillToken and KrillProtocol, and fund participants on a devnet.

Design decisions:
- Deployment goes through the same `Transactor` as every other write (local signing, nonce book,
  revert decoding), so it works on py-evm, Anvil and any JSON-RPC network alike.
- Defaults suit devnets and tests (minimum stakes of 100 tokens, 50-block unbonding); a real
  deployment passes its own values.
"""

from __future__ import annotations

from dataclasses import dataclass

from eth_account.signers.local import LocalAccount
from web3 import Web3

from krill.chain.artifacts import load_artifact
from krill.chain.client import KrillChain
from krill.chain.rpc import DEFAULT_RETRY, RetryPolicy
from krill.chain.token import TokenClient
from krill.chain.tx import Receipt, Transactor

TOKEN = 10**18
DEFAULT_MINIMUM_WORKER_STAKE = 100 * TOKEN
DEFAULT_MINIMUM_VERIFIER_STAKE = 100 * TOKEN
DEFAULT_UNBONDING_BLOCKS = 50


@dataclass(frozen=True)
class Deployment:
    """Where the contracts live."""

    chain_id: int
    token: str
    protocol: str
    block_number: int


def deploy_contract(w3: Web3, account: LocalAccount, name: str, *args, retry: RetryPolicy = DEFAULT_RETRY) -> Receipt:
    """Deploy artifact `name` with constructor `args`; the address is `receipt.contract_address`."""
    artifact = load_artifact(name)
    factory = w3.eth.contract(abi=list(artifact.abi), bytecode=artifact.bytecode)
    return Transactor(w3, account, retry).deploy(factory, args, f"deploy {name}")


def deploy(w3: Web3, admin: LocalAccount, *, minimum_worker_stake: int = DEFAULT_MINIMUM_WORKER_STAKE,
           minimum_verifier_stake: int = DEFAULT_MINIMUM_VERIFIER_STAKE,
           unbonding_blocks: int = DEFAULT_UNBONDING_BLOCKS, token_address: str | None = None,
           retry: RetryPolicy = DEFAULT_RETRY) -> Deployment:
    """Deploy KrillToken (unless `token_address` is given) and KrillProtocol; `admin` holds all admin roles."""
    if token_address is None:
        token_address = deploy_contract(w3, admin, "KrillToken", admin.address, retry=retry).contract_address
    receipt = deploy_contract(w3, admin, "KrillProtocol", token_address, admin.address, minimum_worker_stake,
                              minimum_verifier_stake, unbonding_blocks, retry=retry)
    return Deployment(chain_id=w3.eth.chain_id, token=Web3.to_checksum_address(token_address),
                      protocol=receipt.contract_address, block_number=receipt.block_number)


def fund_accounts(w3: Web3, deployment: Deployment, minter: LocalAccount, accounts: list[str], amount: int) -> None:
    """Mint `amount` tokens to each account (devnets: `minter` holds MINTER_ROLE)."""
    token = TokenClient(w3, deployment.token, minter)
    for address in accounts:
        token.mint(address, amount)


def client(w3: Web3, deployment: Deployment, account: LocalAccount | None = None) -> KrillChain:
    """A KrillChain client for `deployment` acting as `account`."""
    return KrillChain(w3, deployment.protocol, account)
