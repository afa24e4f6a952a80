"""`KrillChain`: the typed client of KrillProtocol that workers, verifiers and coordinators use.

Design decisions:
- One method per state-changing contract function, same name in snake_case, arguments checked
  and typed here (bytes32 as bytes or 0x-hex, integers range-checked, naming the field). Each
  returns a `Receipt` whose typed events carry the results (`receipt.event(Committed).commit_id`),
  so callers get ids and gas from one object. Views come from `ProtocolViews`.
- A client acts as one account; `as_account` gives a client for another account over the same
  connection and nonce book (tests and the demo drive many participants).
- Devnet helper `seal_randomness_now` mines the randomness block if it does not exist yet:
  Anvil and py-evm only produce a block per transaction, so the block after a commit appears
  only once something else happens.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from eth_account.signers.local import LocalAccount
from web3 import Web3

from krill.chain.artifacts import load_artifact
from krill.chain.errors import ChainInputError
from krill.chain.events import ChainEvent, EventStream
from krill.chain.rpc import DEFAULT_RETRY, RetryPolicy, connect_http, endpoint_of, mine, with_retries
from krill.chain.token import TokenClient
from krill.chain.tx import DEFAULT_SEND, Receipt, SendPolicy, Transactor
from krill.chain.types import Role, RunParams, to_bytes32, to_uint
from krill.chain.view_codec import function_codecs
from krill.chain.views import ProtocolViews


class KrillChain(ProtocolViews):
    """KrillProtocol at `protocol_address`, acting as `account` (None: read-only)."""

    def __init__(self, w3: Web3, protocol_address: str, account: LocalAccount | None = None,
                 retry: RetryPolicy = DEFAULT_RETRY, send: SendPolicy = DEFAULT_SEND):
        self.w3 = w3
        self.address = Web3.to_checksum_address(protocol_address)
        self._retry = retry
        self._send_policy = send
        self._contract = w3.eth.contract(address=self.address, abi=list(load_artifact("KrillProtocol").abi))
        self._tx = Transactor(w3, account, retry, send)
        self._token: TokenClient | None = None

    @classmethod
    def connect(cls, rpc_url: str, protocol_address: str, account: LocalAccount | None = None,
                retry: RetryPolicy = DEFAULT_RETRY, send: SendPolicy = DEFAULT_SEND) -> KrillChain:
        """A client over HTTP JSON-RPC."""
        return cls(connect_http(rpc_url), protocol_address, account, retry, send)

    @property
    def account(self) -> LocalAccount | None:
        return self._tx.account

    @property
    def sender(self) -> str:
        """Address this client sends from."""
        return self._tx.address

    def as_account(self, account: LocalAccount) -> KrillChain:
        """The same protocol acting as another account (shares connection and nonce book)."""
        other = KrillChain(self.w3, self.address, account, self._retry, self._send_policy)
        other._token = self._token.as_account(account) if self._token is not None else None
        return other

    @property
    def token(self) -> TokenClient:
        """The stake token, acting as the same account."""
        if self._token is None:
            self._token = TokenClient(self.w3, self.token_address(), self._tx.account, self._retry,
                                      self._send_policy)
        return self._token

    def reset_nonces(self) -> None:
        """Forget cached nonces of every account on this connection (after a devnet revert)."""
        self._tx.nonces.reset()
        self._tx.forget_fees()

    def block_number(self) -> int:
        return with_retries(lambda: self.w3.eth.block_number, "eth_blockNumber", self._retry, endpoint_of(self.w3))

    def ether_balance(self, address: str) -> int:
        """The ether (wei) `address` holds at the latest block, to pay gas with."""
        return int(with_retries(lambda: self.w3.eth.get_balance(address), "eth_getBalance", self._retry,
                                endpoint_of(self.w3)))

    def block_hash(self, number: int) -> bytes:
        """The hash of block `number` (which must exist: BlockNotFound from web3 otherwise)."""
        return bytes(with_retries(lambda: self.w3.eth.get_block(number)["hash"], "eth_getBlockByNumber",
                                  self._retry, endpoint_of(self.w3)))

    def block_time(self, number: int) -> int:
        """The timestamp (unix seconds) of block `number` (which must exist: BlockNotFound from web3 otherwise)."""
        return int(with_retries(lambda: self.w3.eth.get_block(number)["timestamp"], "eth_getBlockByNumber",
                                self._retry, endpoint_of(self.w3)))

    def _send(self, name: str, *args) -> Receipt:
        return self._tx.transact(self.address, function_codecs("KrillProtocol")[name].calldata(args), name)

    # ---------------------------------------------------------------- administration
    def set_minimum_stake(self, role: Role | int, amount: int) -> Receipt:
        return self._send("setMinimumStake", to_uint(int(role), "role", 8), to_uint(amount, "amount"))

    def set_unbonding_blocks(self, blocks: int) -> Receipt:
        return self._send("setUnbondingBlocks", to_uint(blocks, "blocks"))

    def grant_role(self, role: bytes | str, account: str) -> Receipt:
        return self._send("grantRole", to_bytes32(role, "role"), account)

    def revoke_role(self, role: bytes | str, account: str) -> Receipt:
        return self._send("revokeRole", to_bytes32(role, "role"), account)

    def renounce_role(self, role: bytes | str, account: str) -> Receipt:
        return self._send("renounceRole", to_bytes32(role, "role"), account)

    # ---------------------------------------------------------------- stake
    def stake(self, role: Role | int, amount: int, ed25519_public_key: bytes | str) -> Receipt:
        """Stake (or top up); the token allowance must cover `amount` (see `approve_stake`)."""
        return self._send("stake", to_uint(int(role), "role", 8), to_uint(amount, "amount"),
                          to_bytes32(ed25519_public_key, "ed25519_public_key"))

    def approve_stake(self, amount: int) -> Receipt | None:
        """Approve the protocol to take `amount` tokens unless the allowance already covers it."""
        if self.token.allowance(self.sender, self.address) >= amount:
            return None
        return self.token.approve(self.address, amount)

    def request_unstake(self, amount: int) -> Receipt:
        return self._send("requestUnstake", to_uint(amount, "amount"))

    def withdraw(self) -> Receipt:
        return self._send("withdraw")

    # ---------------------------------------------------------------- runs and versions
    def create_run(self, run_id: bytes | str, base_manifest_digest: bytes | str, params: RunParams) -> Receipt:
        return self._send("createRun", to_bytes32(run_id, "run_id"),
                          to_bytes32(base_manifest_digest, "base_manifest_digest"), params.to_abi())

    def fund_rewards(self, run_id: bytes | str, amount: int) -> Receipt:
        return self._send("fundRewards", to_bytes32(run_id, "run_id"), to_uint(amount, "amount"))

    def publish_version(self, run_id: bytes | str, version: int, manifest_digest: bytes | str,
                        record_digest: bytes | str) -> Receipt:
        return self._send("publishVersion", to_bytes32(run_id, "run_id"), to_uint(version, "version", 64),
                          to_bytes32(manifest_digest, "manifest_digest"), to_bytes32(record_digest, "record_digest"))

    # ---------------------------------------------------------------- commitments and verdicts
    def commit(self, run_id: bytes | str, version: int, nonce: int, header_digest: bytes | str) -> Receipt:
        """Commit a header digest; the id is `receipt.event(Committed).commit_id`."""
        return self._send("commit", to_bytes32(run_id, "run_id"), to_uint(version, "version", 64),
                          to_uint(nonce, "nonce", 64), to_bytes32(header_digest, "header_digest"))

    def seal_randomness(self, commit_id: int) -> Receipt:
        """Record the commit's randomness (emits RandomnessSealed the first time only)."""
        return self._send("sealRandomness", to_uint(commit_id, "commit_id"))

    def seal_randomness_now(self, commit_id: int) -> bytes:
        """Devnets: mine the randomness block if needed, seal, and return the randomness."""
        sealed = self.randomness_of(commit_id)
        if sealed != b"\x00" * 32:
            return sealed
        target = self.commit_of(commit_id).commit_block + 1
        head = self.block_number()
        # The randomness block must exist (be mined) before the seal is estimated and sent.
        if head <= target:
            mine(self.w3, target + 1 - head)
        self.seal_randomness(commit_id)
        return self.randomness_of(commit_id)

    def attest(self, commit_id: int, ok: bool, evidence_digest: bytes | str) -> Receipt:
        if not isinstance(ok, bool):
            raise ChainInputError(f"ok: expected a bool, got {ok!r}")
        return self._send("attest", to_uint(commit_id, "commit_id"), ok, to_bytes32(evidence_digest, "evidence_digest"))

    def slash(self, commit_id: int) -> Receipt:
        return self._send("slash", to_uint(commit_id, "commit_id"))

    # ---------------------------------------------------------------- rewards
    def settle(self, run_id: bytes | str, version: int, accounts: Sequence[str], amounts: Sequence[int]) -> Receipt:
        return self._send("settle", to_bytes32(run_id, "run_id"), to_uint(version, "version", 64),
                          [Web3.to_checksum_address(a) for a in accounts],
                          [to_uint(a, f"amounts[{i}]") for i, a in enumerate(amounts)])

    def claim(self) -> Receipt:
        return self._send("claim")

    # ---------------------------------------------------------------- events
    def event_stream(self, from_block: int = 0, confirmations: int = 0, include_token: bool = False) -> EventStream:
        """A cursor over this protocol's events (and the token's if asked), confirmed blocks only."""
        addresses = [self.address] + ([self.token.address] if include_token else [])
        return EventStream(self.w3, addresses, from_block, confirmations, retry=self._retry)

    def events(self, from_block: int = 0, confirmations: int = 0,
               kinds: tuple[type[ChainEvent], ...] | None = None) -> Iterator[ChainEvent]:
        """The protocol's events from `from_block` up to head - `confirmations`, oldest first."""
        return self.event_stream(from_block, confirmations).iter(kinds)
