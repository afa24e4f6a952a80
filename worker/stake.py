"""`krill worker stake`: approve and stake the stake token as a worker, bound to the Ed25519 key.

Design decisions:
- Every precondition the contract would revert on is checked first with views, so the person
  gets a sentence with the numbers and the next step instead of a revert: jailed, staked as
  another role, staked with another Ed25519 key, too few tokens, no ether for gas, below the
  minimum. A revert that still happens (a race) is reported the same way.
- Staking is additive (a top-up), like the contract's `stake`; approval is skipped when the
  allowance already covers the amount.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from krill.config import KrillConfig
from krill.worker.contribute import jailed_message
from krill.worker.errors import JailedError, StakeError

TOKEN = 10**18


def tokens(amount: int) -> str:
    """`amount` base units as a decimal number of tokens."""
    text = f"{Decimal(amount) / TOKEN:f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def parse_tokens(text: str) -> int:
    """A decimal number of tokens ('500', '12.5') as base units."""
    try:
        value = Decimal(text) * TOKEN
    except ArithmeticError:
        raise StakeError(f"--amount: {text!r} is not a number of tokens") from None
    if value <= 0 or value != value.to_integral_value():
        raise StakeError(f"--amount: {text!r} must be positive with at most 18 decimals")
    return int(value)


@dataclass(frozen=True)
class StakeResult:
    address: str
    amount: int
    staked: int
    ed25519_public_key: str
    transaction_hash: str


def stake_worker(config: KrillConfig, amount: int | None = None) -> StakeResult:
    from krill.chain import errors as E
    from krill.chain.events import Staked
    from krill.chain.types import Role
    from krill.runtime import connect_chain, unlock_identity

    identity = unlock_identity(config)
    chain = connect_chain(config, identity.account)
    address, key = identity.address, identity.ed25519_public_key
    amount = config.worker.stake if amount is None else amount
    info = chain.stake_of(address)
    if info.jailed:
        raise JailedError(jailed_message(address))
    if info.role not in (0, Role.WORKER):
        raise StakeError(f"account {address} is already staked as {Role(info.role).name.lower()}; "
                         "a worker needs its own keystore (`krill keys new`)")
    if info.role == Role.WORKER and info.ed25519_public_key != key:
        raise StakeError(f"account {address} is already staked with Ed25519 key {info.ed25519_public_key.hex()[:16]}…, "
                         f"not this keystore's {key.hex()[:16]}…; use the keystore it was staked with")
    balance = chain.token.balance_of(address)
    if balance < amount:
        raise StakeError(f"not enough tokens: {address} holds {tokens(balance)} KRILL, staking needs {tokens(amount)} "
                         "(ask the run's operator for tokens, or pass a smaller --amount)")
    if chain.w3.eth.get_balance(address) == 0:
        raise StakeError(f"{address} has no ether to pay gas for the approve and stake transactions")
    minimum = chain.minimum_stake(Role.WORKER)
    if info.staked + amount < minimum:
        raise StakeError(f"stake of {tokens(info.staked + amount)} KRILL would be below the worker minimum of "
                         f"{tokens(minimum)}: pass --amount {tokens(minimum - info.staked)} or more")
    try:
        chain.approve_stake(amount)
        receipt = chain.stake(Role.WORKER, amount, key)
    except (E.StakeKeyMismatch, E.StakeRoleMismatch, E.StakeBelowMinimum, E.StakeJailed,
            E.ERC20InsufficientBalance) as exc:
        raise StakeError(f"the contract refused the stake: {exc}") from exc
    event = receipt.event(Staked)
    return StakeResult(address, amount, event.staked, key.hex(), receipt.transaction_hash)
