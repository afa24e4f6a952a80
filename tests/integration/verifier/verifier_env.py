"""A real run for the verifier: Anvil, the deployed contracts, a tiny published model, staked workers.

Each test module gets its own Anvil node (started on a free port, stopped by PID), so block
numbers, windows and cursors of one module never leak into another. Contributions are produced
with the protocol core (`sample` / `learn` / `package`), uploaded to a real LocalStore and
committed on-chain, honestly or with one specific forgery.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from nacl.signing import SigningKey

from krill.chain.anvil import AnvilProcess
from krill.chain.client import KrillChain
from krill.chain.deploy import TOKEN, deploy, fund_accounts
from krill.chain.events import Committed
from krill.chain.rpc import connect_http, dev_accounts, mine
from krill.chain.types import Role, RunParams
from krill.model.build import TinyModelSpec, build_tiny_model
from krill.model.publish import publish_model_dir
from krill.payload.limits import PayloadLimits
from krill.protocol.evidence import load_evidence
from krill.protocol.spec import ChainSpec, RolloutSpec, RunSpec, publish_spec
from krill.rl.compression import CompressionConfig
from krill.store.cid import digest_to_cid
from krill.store.local import LocalStore
from krill.verifier.attest import Who
from krill.verifier.loop import LoopSettings, VerifierLoop
from krill.verifier.state import ATTESTED, PENDING, VerifierState

WINDOW = 30
TINY = TinyModelSpec(hidden=32, layers=2, heads=2, intermediate=64)
ADMIN, WORKER_A, WORKER_B, VERIFIER, CLI_VERIFIER = 0, 1, 2, 3, 4


@dataclass
class RunEnv:
    anvil: AnvilProcess
    w3: object
    accounts: list
    protocol: str
    store: LocalStore
    store_path: object
    spec: RunSpec
    keys: dict
    clients: dict = field(default_factory=dict)
    nonces: dict = field(default_factory=dict)
    _base: object = None
    _engine: object = None

    def at(self, index: int) -> KrillChain:
        if index not in self.clients:
            self.clients[index] = KrillChain(self.w3, self.protocol, self.accounts[index])
        return self.clients[index]

    def address(self, index: int) -> str:
        return self.accounts[index].address

    def head(self) -> int:
        return self.w3.eth.block_number

    def mine(self, blocks: int = 1) -> int:
        return mine(self.w3, blocks)

    def next_nonce(self, worker: int) -> int:
        counter = self.nonces.setdefault(worker, itertools.count())
        return next(counter)

    def base(self):
        from krill.protocol.state import load_chain_version

        if self._base is None:
            self._base = load_chain_version(self.at(ADMIN), self.store, self.spec, 0)
        return self._base

    def produce(self, worker: int, tamper: str | None = None):
        """Produce, upload (unless withheld) and commit one contribution; returns (commit id, header)."""
        from krill.protocol.policy import build_model, load_tokenizer
        from krill.protocol.work import (
            Identity,
            Sampled,
            assigned_prompts,
            compute_rewards,
            derived_seed,
            learn,
            package,
            sample,
            sampling_params,
        )
        from krill.rl.engine.hf import HFEngine
        from krill.rl.tasks import get_task

        spec, base = self.spec, self.base()
        task, tok = get_task(spec.task), load_tokenizer(base)
        if self._engine is None:
            self._engine = HFEngine(build_model(base), eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, version=0)
        engine, address, nonce = self._engine, self.address(worker).lower(), self.next_nonce(worker)
        key = SigningKey(b"\x77" * 32) if tamper == "signature" else self.keys[worker]
        who = Identity(self.w3.eth.chain_id, self.protocol, address, key)
        if tamper == "fabricate":
            # Real completions of the right prompts, sampled from another seed: not what the committed
            # seed draws. Rewards and gradients are computed honestly on them.
            indices, prompts, metas = assigned_prompts(spec, task, tok, address, 0, nonce)
            seed = derived_seed(spec, b"sampling", address, 0, nonce) ^ 0x5A5A
            rollouts = engine.generate(prompts, sampling_params(spec, task), seed)
            sampled = Sampled(0, nonce, indices, rollouts, compute_rewards(spec, task, tok, rollouts, metas))
        else:
            sampled = sample(spec, task, tok, engine, address, nonce)
        if tamper == "rewards":
            sampled.rewards = 1.0 - sampled.rewards
        learned = learn(spec, engine.model, base, sampled, [0, 1], tok.pad_token_id)
        if tamper is not None and tamper.startswith("gradient"):  # "gradient": every shard; "gradient-shard-S": S
            rng = np.random.default_rng(nonce)
            forged = None if tamper == "gradient" else int(tamper.rsplit("-", 1)[1])
            learned.values = {s: {n: (v + rng.standard_normal(v.shape).astype(np.float32) * 0.05)
                                  if forged in (None, s) else v for n, v in values.items()}
                              for s, values in learned.values.items()}
        header, files = package(spec, task, who, base, sampled, learned)
        if tamper != "withhold":
            for data in files.values():
                self.store.add(data)
            self.store.put_block(header.encode())
        receipt = self.at(worker).commit(spec.run_id, 0, nonce, header.digest)
        return receipt.event(Committed).commit_id, header


def start_run_env(tmp_path_factory, name: str, accounts: int = 6, model_dir=None,
                  rollout: RolloutSpec | None = None, chain_spec: ChainSpec | None = None,
                  unbonding_blocks: int | None = None) -> RunEnv:
    """A run on a fresh Anvil node; the tiny untrained model unless `model_dir` names another; every
    verifier checks every commit, at quorum 1, unless `chain_spec` says otherwise."""
    root = tmp_path_factory.mktemp(name)
    anvil = AnvilProcess.start(accounts=max(20, accounts))
    try:
        w3 = connect_http(anvil.rpc_url)
        accounts = dev_accounts(accounts)
        admin = accounts[ADMIN]
        # A challenge window must be under the deployment's unbonding period.
        deployment = deploy(w3, admin, **({} if unbonding_blocks is None else {"unbonding_blocks": unbonding_blocks}))
        fund_accounts(w3, deployment, admin, [a.address for a in accounts], 10_000 * TOKEN)
        torch.manual_seed(0)
        if model_dir is None:
            model_dir = root / "model"
            _, tokenizer = build_tiny_model(seed=3, spec=TINY, directory=model_dir)
        else:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        store = LocalStore(root / "store")
        manifest, manifest_cid = publish_model_dir(store, model_dir, num_shards=2)
        chain_spec = chain_spec or ChainSpec(check_probability_ppm=1_000_000, challenge_window_blocks=WINDOW,
                                             attestation_quorum=1)
        spec = RunSpec(name=name, seed=7, task="arithmetic", base_manifest_cid=manifest_cid, num_shards=2,
                       rollout=rollout or RolloutSpec(prompts_per_contribution=4, group_size=4), chain=chain_spec,
                       compression=CompressionConfig(density=0.25, dtype="int8", dense_versions=1),
                       limits=PayloadLimits(vocab_size=len(tokenizer)))
        publish_spec(store, spec)
        c = spec.chain
        params = RunParams(coordinator=admin.address, max_staleness=c.max_staleness,
                           attestation_quorum=c.attestation_quorum, slash_fraction_bps=c.slash_fraction_bps,
                           verifier_bounty_bps=c.verifier_bounty_bps, check_probability_ppm=c.check_probability_ppm,
                           challenge_window_blocks=c.challenge_window_blocks, reward_per_version=c.reward_per_version)
        admin_chain = KrillChain(w3, deployment.protocol, admin)
        admin_chain.create_run(spec.run_id, hashlib.sha256(manifest.canonical_bytes()).digest(), params)
        keys = {i: SigningKey(bytes([i + 1]) * 32) for i in range(len(accounts))}
        env = RunEnv(anvil, w3, accounts, deployment.protocol, store, root / "store", spec, keys)
        for index, role in ((WORKER_A, Role.WORKER), (WORKER_B, Role.WORKER), (VERIFIER, Role.VERIFIER)):
            client = env.at(index)
            client.approve_stake(200 * TOKEN)
            client.stake(role, 200 * TOKEN, bytes(keys[index].verify_key))
        return env
    except BaseException:
        anvil.stop()
        raise


# ------------------------------------------------------------------ driving a verifier


def make_loop(env, path, start_block: int, lines: list[str], verifier: int = VERIFIER) -> VerifierLoop:
    chain = env.at(verifier)
    state = VerifierState(path, contract=env.protocol, run_id=env.spec.run_id, verifier=env.address(verifier))
    who = Who(env.w3.eth.chain_id, env.protocol, env.address(verifier), bytes(env.keys[verifier].verify_key), "hf-torch")
    return VerifierLoop(chain, env.store, env.spec, state, who,
                        LoopSettings(poll_interval_s=0.05, max_backoff_s=1.0, payload_retry_s=0.05),
                        echo=lines.append, start_block=start_block)


def drive(env, loop: VerifierLoop, commit_ids: list[int], timeout: float = 60.0) -> None:
    """Step the loop until every commit is decided, mining a block when randomness needs one.

    No block is mined while a fetch for one of `commit_ids` is queued, running, or done and not yet taken (the
    loop takes it when the commit's retry is due, a time, not a block): the window is counted in blocks, and
    mined at every step (a few hundredths of a second apart), a fetch a loaded machine made a second slow, or
    the retry that takes it, outlasted the window, and the honest commit was attested unavailable or missed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        loop.step()
        if all(loop.state.decision(c).status != PENDING for c in commit_ids):
            return
        if _fetching(loop, set(commit_ids)):
            time.sleep(0.02)
        else:
            env.mine(1)
    raise AssertionError(f"commits {commit_ids} still pending: {[loop.state.decision(c) for c in commit_ids]}")


def _fetching(loop: VerifierLoop, commit_ids: set[int]) -> bool:
    """Whether the loop has a payload fetch (key: commit, name, CID) or an evidence fetch (key: commit) of one
    of `commit_ids` queued, running, or done and not taken."""
    return any(commit_of(key) in commit_ids
               for fetcher, commit_of in ((loop.replayer._fetcher, lambda key: key[0]), (loop._evidence, lambda key: key))
               for key in fetcher.keys())


def verdict(env, loop: VerifierLoop, commit_id: int):
    """The on-chain attestation and the evidence document it points to (checked to match)."""
    decision = loop.state.decision(commit_id)
    assert decision.status == ATTESTED, decision
    onchain = env.at(VERIFIER).attestation_of(commit_id, env.address(VERIFIER))
    assert onchain.exists and onchain.ok == decision.ok
    assert digest_to_cid(onchain.evidence_digest) == decision.evidence_cid
    evidence = load_evidence(env.store, decision.evidence_cid)
    assert hashlib.sha256(evidence.encode()).digest() == onchain.evidence_digest
    assert evidence.commit_id == commit_id and evidence.ok == onchain.ok
    return evidence
