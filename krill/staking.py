"""A participant's stake lifecycle: stake, unstake, withdraw, claim, for workers and verifiers alike.

Design decisions:
- Every precondition the contract would revert on is checked first with views, so the person
  gets one sentence with the numbers and the command that fixes it instead of a revert: jailed,
  staked as the other role or with another Ed25519 key, too few tokens, no ether for gas, below
  the minimum, nothing staked, nothing unbonding, unbonding not over (how many blocks remain),
  nothing to claim. A revert that still happens (a race) is reported the same way.
- Amounts are typed by people in tokens (`500`, `12.5`), never in base units, for both roles;
  `tokens` prints them back exactly.
- The role is a parameter (`"worker"` or `"verifier"`), so the core serves both roles' commands
  without importing either; messages name the role's own commands.
- Unstaking is allowed while jailed (a jailed worker can still recover what was not slashed);
  claiming is not tied to a role, since rewards and bounties are credited to the account.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from krill.config import KrillConfig
from krill.errors import ChainError

TOKEN = 10**18
ROLES = ("worker", "verifier")


class StakingError(ChainError):
    """A stake operation cannot go ahead; the message says what to do instead."""


def tokens(amount: int) -> str:
    """`amount` base units as an exact decimal number of tokens."""
    text = f"{Decimal(amount) / TOKEN:f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def parse_tokens(text: str, option: str = "--amount") -> int:
    """A decimal number of tokens ('500', '12.5') as base units."""
    try:
        value = Decimal(text) * TOKEN
    except (InvalidOperation, ArithmeticError):
        raise StakingError(f"{option}: {text!r} is not a number of tokens (e.g. 500 or 12.5)") from None
    if not value.is_finite() or value <= 0 or value != value.to_integral_value():
        raise StakingError(f"{option}: {text!r} must be a positive number of tokens with at most 18 decimals")
    return int(value)


def role_code(role: str) -> int:
    from krill.chain.types import Role

    if role not in ROLES:
        raise ValueError(f"role: {role!r} is not one of {ROLES}")
    return int(Role.WORKER if role == "worker" else Role.VERIFIER)


def role_name(code: int) -> str:
    return {0: "nothing", 1: "worker", 2: "verifier"}.get(code, f"role {code}")


def jailed_advice(address: str) -> str:
    return (f"account {address} is jailed: a commit of it was slashed after failing verification, and the "
            "contract refuses its stake and commits from now on. Contributing again needs a new account "
            "(`krill worker init --keystore NEW_NAME`, then `krill worker stake`); what is left of the stake can "
            "still be recovered with `krill worker unstake` and, after unbonding, `krill worker withdraw`")


@dataclass(frozen=True)
class Done:
    """What a stake operation did: the amount moved, the resulting figure, the transaction."""

    address: str
    action: str
    amount: int
    transaction_hash: str
    staked: int = 0
    unbonding: int = 0
    release_block: int = 0
    ed25519_public_key: str = ""


def _connect(config: KrillConfig, prompt):
    from krill.runtime import connect_chain, unlock_identity

    identity = unlock_identity(config, prompt)
    return identity, connect_chain(config, identity.account)


def _require_role(info, address: str, role: str) -> None:
    if info.role == 0:
        raise StakingError(f"account {address} has nothing staked: stake first with `krill {role} stake`")
    if info.role != role_code(role):
        other = role_name(info.role)
        raise StakingError(f"account {address} is staked as a {other}, not as a {role}: use `krill {other} ...`")


def stake(config: KrillConfig, role: str, amount: int | None = None, prompt=None) -> Done:
    """Approve and stake `amount` (default: the role's configured stake) bound to the keystore's Ed25519 key."""
    from krill.chain import errors as E
    from krill.chain.events import Staked

    identity, chain = _connect(config, prompt)
    address, key = identity.address, identity.ed25519_public_key
    amount = getattr(config, role).stake if amount is None else amount
    info = chain.stake_of(address)
    if info.jailed:
        raise StakingError(jailed_advice(address))
    if info.role not in (0, role_code(role)):
        raise StakingError(f"account {address} is already staked as {role_name(info.role)}; a {role} needs its own "
                           f"keystore (`krill {role} init --keystore NEW_NAME`)")
    if info.role and info.ed25519_public_key != key:
        raise StakingError(f"account {address} is already staked with Ed25519 key "
                           f"{info.ed25519_public_key.hex()[:16]}…, not this keystore's {key.hex()[:16]}…; use the "
                           "keystore it was staked with")
    balance = chain.token.balance_of(address)
    if balance < amount:
        raise StakingError(f"not enough tokens: {address} holds {tokens(balance)} KRILL, staking needs "
                           f"{tokens(amount)} (ask the run's operator for tokens, or pass a smaller --amount)")
    if chain.ether_balance(address) == 0:
        raise StakingError(f"{address} has no ether to pay gas for the approve and stake transactions "
                           "(send it some, or on a devnet run `krill " + role + " init --devnet` to fund it)")
    minimum = chain.minimum_stake(role_code(role))
    if info.staked + amount < minimum:
        raise StakingError(f"stake of {tokens(info.staked + amount)} KRILL would be below the {role} minimum of "
                           f"{tokens(minimum)} KRILL: pass --amount {tokens(minimum - info.staked)} or more")
    try:
        chain.approve_stake(amount)
        receipt = chain.stake(role_code(role), amount, key)
    except (E.StakeKeyMismatch, E.StakeRoleMismatch, E.StakeBelowMinimum, E.StakeJailed,
            E.ERC20InsufficientBalance) as exc:
        raise StakingError(f"the contract refused the stake: {exc}") from exc
    event = receipt.event(Staked)
    return Done(address, "staked", amount, receipt.transaction_hash, staked=event.staked, ed25519_public_key=key.hex())


def unstake(config: KrillConfig, role: str, amount: int | None = None, prompt=None) -> Done:
    """Move `amount` (default: everything staked) into unbonding; its release block restarts."""
    from krill.chain import errors as E
    from krill.chain.events import UnstakeRequested

    identity, chain = _connect(config, prompt)
    address = identity.address
    info = chain.stake_of(address)
    _require_role(info, address, role)
    if info.staked == 0:
        raise StakingError(f"account {address} has no stake left to unbond ({tokens(info.unbonding)} KRILL already "
                           f"unbonding until block {info.release_block}): `krill {role} withdraw` once it is released")
    amount = info.staked if amount is None else amount
    if amount > info.staked:
        raise StakingError(f"--amount {tokens(amount)} is more than the {tokens(info.staked)} KRILL staked: pass "
                           f"--amount {tokens(info.staked)} or less (or leave it out to unbond everything)")
    try:
        receipt = chain.request_unstake(amount)
    except (E.StakeInsufficient, E.StakeZeroAmount) as exc:
        raise StakingError(f"the contract refused to unbond: {exc}") from exc
    event = receipt.event(UnstakeRequested)
    return Done(address, "unbonding", amount, receipt.transaction_hash, staked=info.staked - amount,
                unbonding=event.unbonding, release_block=event.release_block)


def withdraw(config: KrillConfig, role: str, prompt=None) -> Done:
    """Pay out the whole unbonding balance once its release block is reached."""
    from krill.chain import errors as E
    from krill.chain.events import Withdrawn

    identity, chain = _connect(config, prompt)
    address = identity.address
    info = chain.stake_of(address)
    _require_role(info, address, role)
    if info.unbonding == 0:
        raise StakingError(f"account {address} has nothing unbonding ({tokens(info.staked)} KRILL staked): request "
                           f"it first with `krill {role} unstake [--amount TOKENS]`")
    head = chain.block_number()
    # The contract compares against the block the withdraw lands in, one past the head.
    if head + 1 < info.release_block:
        raise StakingError(f"{tokens(info.unbonding)} KRILL is still unbonding: released at block "
                           f"{info.release_block}, the chain is at block {head}, so {info.release_block - head - 1} "
                           f"more blocks must pass; run `krill {role} withdraw` again then "
                           f"(`krill {role} status` shows the countdown)")
    try:
        receipt = chain.withdraw()
    except (E.StakeStillUnbonding, E.StakeNothingUnbonding) as exc:
        raise StakingError(f"the contract refused the withdrawal: {exc}; see `krill {role} status`") from exc
    event = receipt.event(Withdrawn)
    return Done(address, "withdrawn", event.amount, receipt.transaction_hash, staked=info.staked)


def claim(config: KrillConfig, role: str, prompt=None) -> Done:
    """Pay the account all its credited rewards and bounties."""
    from krill.chain import errors as E
    from krill.chain.events import Claimed

    identity, chain = _connect(config, prompt)
    address = identity.address
    if chain.claimable_of(address) == 0:
        what = ("rewards are credited when the coordinator settles a version your accepted contributions went into"
                if role == "worker" else "bounties are credited when a commit you failed is slashed")
        raise StakingError(f"nothing to claim for {address}: {what}; `krill {role} status` shows what was earned")
    try:
        receipt = chain.claim()
    except E.ClaimNothing as exc:
        raise StakingError(f"nothing to claim for {address} ({exc})") from exc
    return Done(address, "claimed", receipt.event(Claimed).amount, receipt.transaction_hash)
