"""A real coordinator environment: Anvil, the contracts, a local store, SQLite, a tiny random model,
a run created through `create_run`, and workers that stake and commit real contributions made with
`krill.protocol.work` (sample, learn, package)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from krill.model.build import TinyModelSpec, build_tiny_model

TOKEN = 10**18
PASSWORD = "coordinator-test"
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("coordinator-model") / "model"
    build_tiny_model(seed=3, spec=TinyModelSpec(hidden=32, layers=2, heads=2, intermediate=64), directory=path)
    return path


@dataclass
class Env:
    node: object
    deployment: object
    root: Path
    config_path: Path
    chain: object          # admin (= coordinator) client
    store: object
    run_id: bytes = b""
    spec: object = None
    processes: list = field(default_factory=list)

    # ----------------------------------------------------------------- workers
    def stake(self, index: int):
        from nacl.signing import SigningKey

        from krill.chain.rpc import dev_account
        from krill.chain.types import Role
        from krill.protocol.work import Identity

        account = dev_account(index)
        key = SigningKey(bytes([index]) * 32)
        c = self.chain.as_account(account)
        c.approve_stake(100 * TOKEN)
        c.stake(Role.WORKER if index < 10 else Role.VERIFIER, 100 * TOKEN, bytes(key.verify_key))
        return account, Identity(self.deployment.chain_id, self.deployment.protocol.lower(), account.address.lower(), key)

    def produce(self, who, nonce: int, version: int = 0, forge_rewards: bool = False, shift_gradients: bool = False):
        from krill.protocol.policy import build_model, load_tokenizer
        from krill.protocol.state import load_chain_version
        from krill.protocol.work import learn, package, sample
        from krill.rl.engine.hf import HFEngine
        from krill.rl.tasks import get_task

        state = load_chain_version(self.chain, self.store, self.spec, version)
        task, tok = get_task(self.spec.task), load_tokenizer(state)
        model = build_model(state)
        engine = HFEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, version=version)
        sampled = sample(self.spec, task, tok, engine, who.worker, nonce)
        if forge_rewards:  # what the forge-rewards worker reports: every claim wrong
            sampled.rewards = (1.0 - sampled.rewards).to(sampled.rewards.dtype)
        learned = learn(self.spec, model, state, sampled, list(range(self.spec.num_shards)), tok.pad_token_id)
        if shift_gradients:  # gradient values the batch does not give: ingest cannot tell, a verifier's recompute can
            from krill.protocol.work import Learned

            learned = Learned(learned.learner_version, {s: {n: v + np.float32(0.5) for n, v in values.items()}
                                                        for s, values in learned.values.items()}, learned.seconds)
        return package(self.spec, task, who, state, sampled, learned)

    def upload(self, header, files, with_files: bool = True) -> None:
        self.store.put_block(header.encode())
        if with_files:
            for data in files.values():
                self.store.add(data)

    def commit(self, account, header, version: int = 0) -> int:
        from krill.chain.events import Committed

        return self.chain.as_account(account).commit(self.run_id, version, header.nonce, header.digest).event(
            Committed).commit_id

    # ----------------------------------------------------------------- coordinator
    def context(self):
        """An in-process coordinator over this environment (same objects `krill coordinator run` builds)."""
        from krill.coordinator.context import RunContext
        from krill.db.indexer import Indexer
        from krill.db.session import open_database
        from krill.protocol.state import load_run

        db = open_database(f"sqlite:///{self.root / 'krill.db'}")
        spec = load_run(self.chain, self.store, self.run_id)
        ctx = RunContext(chain=self.chain, store=self.store, db=db, spec=spec, chain_id=self.deployment.chain_id)
        return ctx, Indexer(self.chain, db, self.store, start_block=self.deployment.block_number)

    def spawn(self, *args: str, halt: str | None = None) -> subprocess.Popen:
        env = {**os.environ, "KRILL_HOME": str(self.root), "PYTHONUNBUFFERED": "1"}
        if halt:
            env["KRILL_COORDINATOR_HALT"] = halt
        proc = subprocess.Popen([sys.executable, "-m", "krill.coordinator", "--config", str(self.config_path),
                                 "--set", f"run.id=0x{self.run_id.hex()}", *args],
                                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.processes.append(proc)
        return proc


def wait_for(condition, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def index_with_headers(indexer) -> None:
    """Sync `indexer` with every header fetch it queued finished and recorded: a sync waits 2 s for them and
    leaves the rest running, which on a loaded machine then meet the store a test patches afterwards."""
    indexer.sync()
    wait_for(lambda: indexer._fetcher.in_flight() == 0, 30, "the index's header fetches")
    indexer.sync()


def step(coordinator, timeout: float = 60.0) -> list:
    """`coordinator.step()`, again while it published nothing and a fetch it queued (its ingest's or its index's)
    is queued, running or not yet taken; every version published. A pass waits `PASS_WAIT_S` (2 s) for its
    fetches and leaves the rest to the next pass: a loaded machine's fetch can take longer, and a test that
    expects a version from one pass then sees none. With no fetch left over, one pass is the whole answer."""
    deadline = time.monotonic() + timeout
    out = coordinator.step()
    while not out and _fetching(coordinator.ctx.fetcher, coordinator.indexer._fetcher):
        if time.monotonic() > deadline:
            raise AssertionError(f"fetches still running after {timeout:.0f} s of passes")
        time.sleep(0.05)
        out = coordinator.step()
    return out


def ingest_taken(ctx, next_version: int, now: float | None = None, timeout: float = 60.0):
    """`ingest(ctx, next_version, now)`, again while a fetch it queued is queued, running or not yet taken; the
    last pass's report, with the passes' accepted, rejected, bytes and reasons summed. A pass waits
    `PASS_WAIT_S` (2 s) for its fetches and leaves the rest pending for the next pass: a loaded machine's fetch
    can take longer, and a test that expects a decision from one pass then sees 'fetching content'. With no
    fetch left over, one pass is the whole answer."""
    from krill.coordinator.ingest import ingest

    deadline = time.monotonic() + timeout
    report = ingest(ctx, next_version, now=now)
    while _fetching(ctx.fetcher):
        if time.monotonic() > deadline:
            raise AssertionError(f"fetches still running after {timeout:.0f} s of ingest passes")
        time.sleep(0.05)
        later = ingest(ctx, next_version, now=now)
        later.accepted += report.accepted
        later.rejected += report.rejected
        later.bytes_received += report.bytes_received
        for code, n in report.reasons.items():
            later.reasons[code] = later.reasons.get(code, 0) + n
        report = later
    return report


def _fetching(*fetchers) -> bool:
    return any(fetcher.keys() for fetcher in fetchers)


def make_env(root: Path, model_dir: Path, spec: dict) -> Env:
    import tomli_w

    from krill.chain.anvil import AnvilProcess
    from krill.chain.client import KrillChain
    from krill.chain.devnet import provision
    from krill.chain.rpc import connect_http, dev_account
    from krill.coordinator.create_run import create_run
    from krill.keystore import KdfCost, create_keystore
    from krill.store.local import LocalStore

    root.mkdir(parents=True, exist_ok=True)
    node = AnvilProcess.start()
    try:
        deployment = provision(node.rpc_url, accounts=12)
        admin = dev_account(0)
        keystore = create_keystore("coordinator", PASSWORD, directory=root / "keys", private_key=bytes(admin.key),
                                   ed25519_seed=b"\x11" * 32, cost=KdfCost.FAST)
        config = {"chain": {"rpc_url": node.rpc_url, "chain_id": deployment.chain_id,
                            "protocol_address": deployment.protocol, "token_address": deployment.token,
                            "deploy_block": deployment.block_number},
                  "store": {"type": "local", "path": str(root / "store")},
                  "database": {"url": f"sqlite:///{root / 'krill.db'}"},
                  "keystore": {"path": str(keystore.path), "password": PASSWORD},
                  "coordinator": {"poll_interval_s": 0.1, "eval_every": 1, "max_backoff_s": 2.0}}
        config_path = root / "config.toml"
        config_path.write_text(tomli_w.dumps(config))
        chain = KrillChain(connect_http(node.rpc_url), deployment.protocol, admin)
        store = LocalStore(root / "store")
        env = Env(node, deployment, root, config_path, chain, store)
        created = create_run(chain, store, model_dir, name="itest", num_shards=2, overrides=spec, save=False)
        from krill.protocol.state import load_run

        env.run_id = bytes.fromhex(created.run_id)
        env.spec = load_run(chain, store, env.run_id)
        return env
    except BaseException:
        node.stop()
        raise


SMALL_SPEC = {"rollout": {"prompts_per_contribution": 2, "group_size": 4},
              "version": {"contributions": 2, "deadline_s": 600.0}, "chain": {"max_staleness": 0},
              "eval_n": 16,
              # version 0 dense, the versions after sparse: both kinds of mask go through the protocol
              "compression": {"dense_versions": 1}}


@pytest.fixture
def coordinator_env(tmp_path, tiny_model_dir):
    """A fresh environment per test; stops every process it started (by PID)."""
    envs: list[Env] = []

    def make(spec: dict | None = None) -> Env:
        env = make_env(tmp_path / f"env{len(envs)}", tiny_model_dir, spec or SMALL_SPEC)
        envs.append(env)
        return env

    yield make
    for env in envs:
        for proc in env.processes:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
        env.node.stop()
