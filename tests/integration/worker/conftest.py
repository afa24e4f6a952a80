"""Worker fixtures: one Anvil with Krill deployed, a local store with a tiny published model,
keystores for staked worker accounts, and helpers to create runs, publish versions and write
worker configs. Each test creates its own run (the run id is the spec's hash), so tests share the
node without sharing state."""

from __future__ import annotations

import hashlib
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tomli_w
from worker_accounts import PASSWORD, STAKE, UNSTAKED, VERIFIER, WORKERS

from krill.chain.anvil import AnvilProcess
from krill.chain.client import KrillChain
from krill.chain.deploy import TOKEN, deploy, fund_accounts
from krill.chain.rpc import connect_http, dev_accounts
from krill.chain.types import Role, RunParams
from krill.keystore import KdfCost, create_keystore
from krill.model.build import TinyModelSpec, build_tiny_model
from krill.model.publish import publish_model_dir
from krill.payload.limits import PayloadLimits
from krill.protocol.spec import ChainSpec, RolloutSpec, RunSpec, publish_spec
from krill.rl.compression import CompressionConfig
from krill.rl.staleness import StalenessConfig
from krill.store.local import LocalStore


@dataclass
class Run:
    spec: RunSpec
    run_id: bytes


@dataclass
class WorkerEnv:
    node: AnvilProcess
    w3: object
    deployment: object
    accounts: list
    root: Path
    store: LocalStore
    manifest: object
    manifest_cid: str
    vocab_size: int

    @property
    def admin(self) -> KrillChain:
        return KrillChain(self.w3, self.deployment.protocol, self.accounts[0])

    def chain(self, index: int) -> KrillChain:
        return KrillChain(self.w3, self.deployment.protocol, self.accounts[index])

    def keystore(self, index: int) -> Path:
        return self.root / "keys" / f"acct{index}.json"

    def new_run(self, name: str, max_staleness: int = 2, quorum: int = 1) -> Run:
        spec = RunSpec(name=name, seed=11, task="arithmetic", base_manifest_cid=self.manifest_cid, num_shards=2,
                       rollout=RolloutSpec(prompts_per_contribution=4, group_size=4),
                       staleness=StalenessConfig(max_staleness=max_staleness), compression=CompressionConfig(density=0.25, dtype="int8", dense_versions=1),
                       chain=ChainSpec(max_staleness=max_staleness, attestation_quorum=quorum,
                                       check_probability_ppm=1_000_000, challenge_window_blocks=40),
                       limits=PayloadLimits(vocab_size=self.vocab_size + 8))
        run_id = publish_spec(self.store, spec)
        c = spec.chain
        params = RunParams(coordinator=self.accounts[0].address, max_staleness=c.max_staleness,
                           attestation_quorum=c.attestation_quorum, slash_fraction_bps=c.slash_fraction_bps,
                           verifier_bounty_bps=c.verifier_bounty_bps, check_probability_ppm=c.check_probability_ppm,
                           challenge_window_blocks=c.challenge_window_blocks, reward_per_version=c.reward_per_version)
        self.admin.create_run(run_id, hashlib.sha256(self.manifest.canonical_bytes()).digest(), params)
        return Run(spec, run_id)

    def publish_next(self, run: Run, seed: int = 0) -> int:
        """Fold seeded random gradients into the latest version and publish the result on-chain."""
        from krill.protocol.state import load_chain_version
        from krill.protocol.step import Submission, fold_version, publish_version_content

        chain = self.admin
        parent = load_chain_version(chain, self.store, run.spec, chain.run_of(run.run_id).latest_version)
        masks = parent.masks()
        rng = np.random.default_rng(seed)
        values = {s: {n: rng.standard_normal(int(masks[n].numel())).astype(np.float32)
                      for n in parent.manifest.shard_names(s)} for s in range(parent.manifest.num_shards)}
        results = fold_version(run.spec, parent, [Submission(1, 1.0, parent.version, values)], {parent.version: parent})
        manifest, _, record, *_ = publish_version_content(self.store, run.spec, parent, results, [], [], "deadline")
        version = parent.version + 1
        chain.publish_version(run.run_id, version, hashlib.sha256(manifest.canonical_bytes()).digest(), record.digest)
        return version

    def config_path(self, index: int, run: Run, state_dir: Path, rpc_url: str | None = None,
                    keystore: Path | None = None, **worker) -> Path:
        data = {
            "chain": {"rpc_url": rpc_url or self.node.rpc_url, "chain_id": 31337,
                      "protocol_address": self.deployment.protocol, "token_address": self.deployment.token,
                      "deploy_block": self.deployment.block_number, "retries": 1, "request_timeout_s": 5.0},
            "store": {"type": "local", "path": str(self.root / "store")},
            "keystore": {"path": str(keystore or self.keystore(index)), "password": PASSWORD},
            "run": {"id": run.run_id.hex()},
            "worker": {"state_dir": str(state_dir), "poll_interval_s": 0.2, "max_backoff_s": 1.0, **worker},
        }
        path = state_dir.parent / f"{state_dir.name}.toml"
        state_dir.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(tomli_w.dumps(data), encoding="utf-8")
        return path


@pytest.fixture(scope="session")
def worker_env(tmp_path_factory):
    root = tmp_path_factory.mktemp("worker-env")
    with AnvilProcess.start(accounts=10) as node:
        w3 = connect_http(node.rpc_url)
        accounts = dev_accounts(10)
        deployment = deploy(w3, accounts[0])
        fund_accounts(w3, deployment, accounts[0], [a.address for a in accounts], 1_000 * TOKEN)
        _, tokenizer = build_tiny_model(seed=5, spec=TinyModelSpec(hidden=32, layers=2, heads=2, intermediate=64),
                                        directory=root / "model")
        store = LocalStore(root / "store")
        manifest, manifest_cid = publish_model_dir(store, root / "model", num_shards=2)
        env = WorkerEnv(node, w3, deployment, accounts, root, store, manifest, manifest_cid, tokenizer.vocab_size)
        for i in (*WORKERS, UNSTAKED, VERIFIER):
            create_keystore(f"acct{i}", PASSWORD, directory=root / "keys", private_key=accounts[i].key,
                            ed25519_seed=hashlib.sha256(f"ed25519/{i}".encode()).digest(), cost=KdfCost.FAST)
        for i in WORKERS:
            from krill.keystore import unlock

            key = unlock(env.keystore(i), PASSWORD).ed25519_public_key
            chain = env.chain(i)
            chain.approve_stake(STAKE)
            chain.stake(Role.WORKER, STAKE, key)
        verifier = env.chain(VERIFIER)
        verifier.approve_stake(STAKE)
        verifier.stake(Role.VERIFIER, STAKE, hashlib.sha256(b"verifier key").digest())
        yield env


@pytest.fixture
def processes():
    """Worker processes a test started; each stopped by PID afterwards."""
    from krill.chain.anvil import stop_pid

    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            stop_pid(proc.pid, timeout=5.0, popen=proc)
