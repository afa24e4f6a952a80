"""A scripted protocol history with real signed headers and manifests, for the index tests.

It drives the real contracts through `KrillChain` (as `krill.demo.scripted_round` does) and puts
real Ed25519-signed headers and real manifests into a local content store, covering every case
the indexer distinguishes: an honest header, a cheat's header (later slashed), a header that was
never uploaded, one with a forged signature and one that contradicts its commit.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from nacl.signing import SigningKey

from krill.chain.client import KrillChain
from krill.chain.deploy import TOKEN, Deployment, deploy, fund_accounts
from krill.chain.events import Committed
from krill.chain.rpc import dev_accounts, mine
from krill.chain.types import Role, RunParams
from krill.model.manifest import Manifest, ParameterEntry, ShardEntry
from krill.payload.header import FileRef, HeaderBody, SamplingParams, grad_file
from krill.store.cid import file_cid

RUN_ID = hashlib.sha256(b"krill-index-test-run").digest()
UNBONDING = 20


def digest(label: str) -> bytes:
    return hashlib.sha256(label.encode()).digest()


def manifest(version: int, parent: str | None) -> Manifest:
    shards = [ShardEntry(index=i, cid=file_cid(f"shard {i} v{version}".encode()),
                         sha256=hashlib.sha256(f"shard {i} v{version}".encode()).hexdigest(), size=11 + i,
                         parameters=[ParameterEntry(name=f"layer{i}.weight", shape=[4, 3 + i], dtype="F32"),
                                     ParameterEntry(name=f"layer{i}.bias", shape=[4], dtype="F32")])
              for i in range(2)]
    return Manifest(version=version, parent=parent, architecture={"model_type": "llama"},
                    tokenizer=file_cid(b"tokenizer bundle"), shards=shards)


def _file(label: str) -> FileRef:
    data = label.encode()
    return FileRef(cid=file_cid(data), sha256=hashlib.sha256(data).hexdigest(), size=len(data))


@dataclass
class Scenario:
    """What was played: where, by whom, and which header digest is in which state."""

    w3: object
    deployment: Deployment
    admin: object
    workers: list
    verifiers: list
    keys: dict = field(default_factory=dict)
    commits: dict = field(default_factory=dict)      # label -> commit id
    withheld: dict = field(default_factory=dict)     # label -> header bytes not uploaded
    manifest_cids: dict = field(default_factory=dict)

    def chain(self, account=None) -> KrillChain:
        return KrillChain(self.w3, self.deployment.protocol, account or self.admin)


def header(sc: Scenario, worker, version: int, nonce: int, manifest_cid: str, *, sign_with: SigningKey | None = None,
           claimed_nonce: int | None = None) -> bytes:
    key = sc.keys[worker.address]
    body = HeaderBody(run_id=RUN_ID.hex(), chain_id=sc.deployment.chain_id, contract=sc.deployment.protocol.lower(),
                      worker=worker.address.lower(), ed25519_key=bytes(key.verify_key).hex(), model_version=version, behaviour_version=version,
                      manifest_cid=manifest_cid, task="arithmetic", prompt_seed=1000 + nonce,
                      nonce=nonce if claimed_nonce is None else claimed_nonce,
                      sampling=SamplingParams(temperature_milli=1000, max_new_tokens=4, seed=2**64 - 1 - nonce),
                      files={"rollouts.safetensors": _file(f"rollouts {nonce}"), grad_file(0): _file(f"g0 {nonce}"),
                             grad_file(1): _file(f"g1 {nonce}")})
    if sign_with is None:
        return body.sign(key).encode()
    # A forged signature: the key named is the staked one, the signature is another key's.
    forged = body.sign(key).model_copy(update={"signature": sign_with.sign(body.signing_digest()).signature.hex()})
    return forged.encode()


def play(w3, store) -> Scenario:
    """Deploy and play the history; returns what the tests check against."""
    admin, w1, w2, v1, v2 = dev_accounts(5)
    deployment = deploy(w3, admin, minimum_worker_stake=100 * TOKEN, minimum_verifier_stake=50 * TOKEN,
                        unbonding_blocks=UNBONDING)
    fund_accounts(w3, deployment, admin, [a.address for a in (admin, w1, w2, v1, v2)], 10_000 * TOKEN)
    sc = Scenario(w3, deployment, admin, [w1, w2], [v1, v2])
    chain = sc.chain()
    for i, account in enumerate((w1, w2, v1, v2)):
        sc.keys[account.address] = SigningKey(hashlib.sha256(f"ed25519 seed {i}".encode()).digest())

    base = manifest(0, None).canonical_bytes()
    sc.manifest_cids[0] = store.put_block(base)
    params = RunParams(coordinator=admin.address, max_staleness=2, attestation_quorum=2, slash_fraction_bps=5000,
                       verifier_bounty_bps=2000, check_probability_ppm=1_000_000, challenge_window_blocks=10,
                       reward_per_version=100 * TOKEN)
    chain.create_run(RUN_ID, hashlib.sha256(base).digest(), params)
    chain.token.approve(chain.address, 1_000 * TOKEN)
    chain.fund_rewards(RUN_ID, 1_000 * TOKEN)
    for account, role, amount in ((w1, Role.WORKER, 300), (w2, Role.WORKER, 200), (v1, Role.VERIFIER, 100),
                                  (v2, Role.VERIFIER, 60)):
        c = chain.as_account(account)
        c.approve_stake(amount * TOKEN)
        c.stake(role, amount * TOKEN, bytes(sc.keys[account.address].verify_key))

    plan = (("honest", w1, 0, {}, True), ("cheat", w2, 0, {}, True), ("withheld", w1, 1, {}, False),
            ("forged", w2, 1, {"sign_with": SigningKey(digest("not the staked key"))}, True),
            ("contradicting", w1, 2, {"claimed_nonce": 7}, True))
    for label, worker, nonce, extra, upload in plan:
        data = header(sc, worker, 0, nonce, sc.manifest_cids[0], **extra)
        if upload:
            store.put_block(data)
        else:
            sc.withheld[label] = data
        ev = chain.as_account(worker).commit(RUN_ID, 0, nonce, hashlib.sha256(data).digest()).event(Committed)
        sc.commits[label] = ev.commit_id

    for label in ("honest", "cheat"):
        chain.seal_randomness_now(sc.commits[label])
        for verifier in (v1, v2):
            chain.as_account(verifier).attest(sc.commits[label], label == "honest", digest(f"evidence {label}"))
    chain.slash(sc.commits["cheat"])

    v1_manifest = manifest(1, sc.manifest_cids[0]).canonical_bytes()
    sc.manifest_cids[1] = store.put_block(v1_manifest)
    chain.publish_version(RUN_ID, 1, hashlib.sha256(v1_manifest).digest(), digest("record v1"))
    chain.settle(RUN_ID, 1, [w1.address, v1.address], [70 * TOKEN, 30 * TOKEN])
    for account in (w1, v1):
        chain.as_account(account).claim()
    chain.as_account(v2).request_unstake(10 * TOKEN)
    # The cheat unbonds everything after its slash; the honest worker unbonds and withdraws part.
    chain.as_account(w2).request_unstake(chain.stake_of(w2.address).staked)
    chain.as_account(w1).request_unstake(50 * TOKEN)
    mine(w3, UNBONDING + 1)
    chain.as_account(w1).withdraw()
    return sc
