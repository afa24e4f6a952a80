"""Chain fixtures: one deployed Krill per backend (py-evm in process, a real Anvil), reset per test.

Each backend is set up once per session (deploy, mint, approve, create a run); every test runs
inside a devnet snapshot that is reverted afterwards, so tests are independent and fast. The
Anvil node is started on a free port and stopped by PID by `AnvilProcess`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from chain_constants import (  # noqa: F401 - re-exported for the fixtures below
    ACCOUNTS,
    BASE_MANIFEST,
    CHALLENGE_WINDOW,
    CROWD,
    FUNDED,
    MIN_VERIFIER,
    MIN_WORKER,
    POOL,
    RUN_ID,
    UNBONDING,
    WIDE_RUN,
    digest,
    key_of,
)
from eth_account import Account
from web3 import Web3

from krill.chain.anvil import AnvilProcess
from krill.chain.client import KrillChain
from krill.chain.deploy import TOKEN, Deployment, deploy
from krill.chain.rpc import connect_http, connect_in_process, dev_accounts, mine, revert, snapshot
from krill.chain.token import TokenClient
from krill.chain.tx import Transactor
from krill.chain.types import Role, RunParams


@dataclass
class ChainEnv:
    """A deployed Krill on one backend, with named participants."""

    backend: str
    w3: object
    deployment: Deployment
    accounts: list
    params: RunParams
    clients: dict = field(default_factory=dict)

    # Participant indexes into `accounts`.
    ADMIN, COORDINATOR = 0, 1
    WORKERS = (2, 3, 4)
    VERIFIERS = (5, 6, 7)
    OUTSIDER = 8

    def at(self, index: int) -> KrillChain:
        """The protocol client acting as account `index`."""
        if index not in self.clients:
            self.clients[index] = KrillChain(self.w3, self.deployment.protocol, self.accounts[index])
        return self.clients[index]

    def token(self, index: int) -> TokenClient:
        return self.at(index).token

    def addr(self, index: int) -> str:
        return self.accounts[index].address

    @property
    def admin(self) -> KrillChain:
        return self.at(self.ADMIN)

    @property
    def coordinator(self) -> KrillChain:
        return self.at(self.COORDINATOR)

    def stake_all(self) -> None:
        for i in self.WORKERS:
            self.at(i).stake(Role.WORKER, MIN_WORKER * 2, key_of(i))
        for i in self.VERIFIERS:
            self.at(i).stake(Role.VERIFIER, MIN_VERIFIER * 2, key_of(i))

    def mine(self, blocks: int = 1) -> int:
        return mine(self.w3, blocks)

    def block(self) -> int:
        return self.admin.block_number()


def _setup(backend: str, w3) -> ChainEnv:
    accounts = dev_accounts(ACCOUNTS)
    admin = accounts[ChainEnv.ADMIN]
    deployment = deploy(w3, admin, minimum_worker_stake=MIN_WORKER, minimum_verifier_stake=MIN_VERIFIER,
                        unbonding_blocks=UNBONDING)
    params = RunParams(coordinator=accounts[ChainEnv.COORDINATOR].address, max_staleness=2, attestation_quorum=2,
                       slash_fraction_bps=5_000, verifier_bounty_bps=2_000, check_probability_ppm=500_000,
                       challenge_window_blocks=CHALLENGE_WINDOW, reward_per_version=1_000 * TOKEN)
    env = ChainEnv(backend, w3, deployment, accounts, params)
    for i in range(1, 10):
        env.token(ChainEnv.ADMIN).mint(accounts[i].address, FUNDED)
        env.token(i).approve(deployment.protocol, 2**256 - 1)
    env.token(ChainEnv.ADMIN).mint(admin.address, FUNDED)
    env.token(ChainEnv.ADMIN).approve(deployment.protocol, 2**256 - 1)
    env.admin.create_run(RUN_ID, BASE_MANIFEST, params)
    env.admin.fund_rewards(RUN_ID, POOL)
    return env


@pytest.fixture(scope="session", params=["py-evm", "anvil"])
def chain_session(request):
    if request.param == "py-evm":
        yield _setup("py-evm", connect_in_process(accounts=ACCOUNTS))
        return
    with AnvilProcess.start(accounts=ACCOUNTS) as node:
        yield _setup("anvil", connect_http(node.rpc_url))


@pytest.fixture
def env(chain_session: ChainEnv):
    """The session's deployment, returned to its set-up state after the test."""
    snap = snapshot(chain_session.w3)
    chain_session.admin.reset_nonces()
    try:
        yield chain_session
    finally:
        revert(chain_session.w3, snap)
        chain_session.admin.reset_nonces()


@pytest.fixture
def staked(env: ChainEnv) -> ChainEnv:
    """`env` with every worker and verifier staked at twice its minimum."""
    env.stake_all()
    return env


@pytest.fixture
def crowd(staked: ChainEnv) -> list[KrillChain]:
    """`staked` plus CROWD more verifiers at the minimum stake (clients acting as each), and run
    WIDE_RUN, whose challenge window holds a verdict from every one of them (one block each).

    About 200 transactions per backend: tests using it are marked slow.
    """
    env = staked
    admin_tx = Transactor(env.w3, env.accounts[env.ADMIN])
    clients = []
    for i in range(CROWD):
        account = Account.from_key(Web3.keccak(text=f"extra verifier {i}"))
        admin_tx.send_value(account.address, 10**17)
        env.token(env.ADMIN).mint(account.address, MIN_VERIFIER)
        client = env.admin.as_account(account)
        client.token.approve(env.deployment.protocol, MIN_VERIFIER)
        client.stake(Role.VERIFIER, MIN_VERIFIER, key_of(100 + i))
        clients.append(client)
    env.admin.set_unbonding_blocks(4 * CROWD)
    env.admin.create_run(WIDE_RUN, digest("wide base"), replace(env.params, challenge_window_blocks=3 * CROWD))
    return clients
