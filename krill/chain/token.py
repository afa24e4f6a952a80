"""Typed client of KrillToken (ERC-20 + burnable + minter role).

Design decisions:
- Same shape as `KrillChain`: one method per contract function, writes return a `Receipt`
  with typed events, reverts raise their custom-error class (ERC20InsufficientBalance, ...).
"""

from __future__ import annotations

from eth_account.signers.local import LocalAccount
from web3 import Web3

from krill.chain.artifacts import load_artifact
from krill.chain.rpc import DEFAULT_RETRY, RetryPolicy
from krill.chain.tx import DEFAULT_SEND, Receipt, SendPolicy, Transactor
from krill.chain.types import to_bytes32, to_uint
from krill.chain.view_codec import function_codecs, view_codecs


class TokenClient:
    """KrillToken at `address`, acting as `account` (None: read-only)."""

    def __init__(self, w3: Web3, address: str, account: LocalAccount | None = None,
                 retry: RetryPolicy = DEFAULT_RETRY, send: SendPolicy = DEFAULT_SEND):
        self.w3 = w3
        self.address = Web3.to_checksum_address(address)
        self._contract = w3.eth.contract(address=self.address, abi=list(load_artifact("KrillToken").abi))
        self._tx = Transactor(w3, account, retry, send)
        self._retry = retry
        self._send_policy = send

    def as_account(self, account: LocalAccount) -> TokenClient:
        """The same token acting as another account (shares the nonce book and the send policy)."""
        return TokenClient(self.w3, self.address, account, self._retry, self._send_policy)

    def _send(self, name: str, *args) -> Receipt:
        return self._tx.transact(self.address, function_codecs("KrillToken")[name].calldata(args), name)

    def _view(self, name: str, *args):
        return self._tx.call_view(self.address, view_codecs("KrillToken")[name], args, name)

    # writes
    def mint(self, to: str, amount: int) -> Receipt:
        return self._send("mint", to, to_uint(amount, "amount"))

    def transfer(self, to: str, amount: int) -> Receipt:
        return self._send("transfer", to, to_uint(amount, "amount"))

    def transfer_from(self, owner: str, to: str, amount: int) -> Receipt:
        return self._send("transferFrom", owner, to, to_uint(amount, "amount"))

    def approve(self, spender: str, amount: int) -> Receipt:
        return self._send("approve", spender, to_uint(amount, "amount"))

    def burn(self, amount: int) -> Receipt:
        return self._send("burn", to_uint(amount, "amount"))

    def burn_from(self, owner: str, amount: int) -> Receipt:
        return self._send("burnFrom", owner, to_uint(amount, "amount"))

    def grant_role(self, role: bytes | str, account: str) -> Receipt:
        return self._send("grantRole", to_bytes32(role, "role"), account)

    def revoke_role(self, role: bytes | str, account: str) -> Receipt:
        return self._send("revokeRole", to_bytes32(role, "role"), account)

    def renounce_role(self, role: bytes | str, account: str) -> Receipt:
        return self._send("renounceRole", to_bytes32(role, "role"), account)

    # views
    def balance_of(self, account: str) -> int:
        return self._view("balanceOf", account)

    def allowance(self, owner: str, spender: str) -> int:
        return self._view("allowance", owner, spender)

    def total_supply(self) -> int:
        return self._view("totalSupply")

    def name(self) -> str:
        return self._view("name")

    def symbol(self) -> str:
        return self._view("symbol")

    def decimals(self) -> int:
        return self._view("decimals")

    def has_role(self, role: bytes | str, account: str) -> bool:
        return self._view("hasRole", to_bytes32(role, "role"), account)

    def get_role_admin(self, role: bytes | str) -> bytes:
        return bytes(self._view("getRoleAdmin", to_bytes32(role, "role")))

    def supports_interface(self, interface_id: bytes) -> bool:
        return self._view("supportsInterface", interface_id)

    def minter_role(self) -> bytes:
        return bytes(self._view("MINTER_ROLE"))

    def default_admin_role(self) -> bytes:
        return bytes(self._view("DEFAULT_ADMIN_ROLE"))
