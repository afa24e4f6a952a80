"""One scripted protocol round on a fresh chain: stake, commit, attest, slash, publish, settle, claim.

Design decisions:
- It drives the real contracts through the same typed client the roles use, as distinct dev
  accounts (admin/coordinator, two workers, two verifiers), so every line printed is what the
  chain said (events and views), not what the script assumed.
- The commits carry sha256 digests of signed-looking headers made here; no model work happens.
  It is the smoke test of the chain layer that `krill demo` runs until the full protocol demo.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

from krill.chain.types import Role, RunParams

TOKEN = 10**18


@dataclass
class RoundReport:
    rpc_url: str
    protocol: str
    lines: list[tuple[str, str]] = field(default_factory=list)
    summary: dict = field(default_factory=dict)


def run_scripted_round(rpc_url: str, echo: Callable[[str, str], None] | None = None) -> RoundReport:
    """Deploy on `rpc_url` and play one round; `echo(step, what_the_chain_said)` streams progress."""
    from krill.chain.client import KrillChain
    from krill.chain.deploy import deploy, fund_accounts
    from krill.chain.events import (
        Attested,
        BountyCredited,
        Claimed,
        Committed,
        RandomnessSealed,
        RewardCredited,
        RewardsFunded,
        Slashed,
        Staked,
        VersionPublished,
        WorkerJailed,
    )
    from krill.chain.rpc import connect_http, dev_accounts

    w3 = connect_http(rpc_url)
    admin, honest, cheat, ver1, ver2 = dev_accounts(5)
    deployment = deploy(w3, admin)
    fund_accounts(w3, deployment, admin, [a.address for a in (admin, honest, cheat, ver1, ver2)], 10_000 * TOKEN)
    report = RoundReport(rpc_url, deployment.protocol)

    def say(step: str, text: str) -> None:
        report.lines.append((step, text))
        if echo:
            echo(step, text)

    chain = KrillChain(w3, deployment.protocol, admin)
    say("deploy", f"KrillToken {deployment.token}, KrillProtocol {deployment.protocol} (block {deployment.block_number})")
    run_id = hashlib.sha256(b"krill-demo-round").digest()
    params = RunParams(coordinator=admin.address, max_staleness=2, attestation_quorum=2, slash_fraction_bps=5000,
                       verifier_bounty_bps=2000, check_probability_ppm=1_000_000, challenge_window_blocks=20,
                       reward_per_version=100 * TOKEN)
    chain.create_run(run_id, hashlib.sha256(b"base manifest").digest(), params)
    chain.token.approve(chain.address, 1_000 * TOKEN)
    funded = chain.fund_rewards(run_id, 1_000 * TOKEN).event(RewardsFunded)
    say("createRun", f"run {run_id.hex()[:16]}… quorum 2, slash 50%, bounty 20%, pool {funded.reward_pool // TOKEN} KRILL")

    for account, role in ((honest, Role.WORKER), (cheat, Role.WORKER), (ver1, Role.VERIFIER), (ver2, Role.VERIFIER)):
        c = chain.as_account(account)
        c.approve_stake(500 * TOKEN)
        ev = c.stake(role, 500 * TOKEN, hashlib.sha256(account.address.encode()).digest()).event(Staked)
        say("stake", f"{role.name.lower():8} {account.address} staked {ev.staked // TOKEN} KRILL")

    commits = {}
    for account, label in ((honest, "honest"), (cheat, "forged")):
        digest = hashlib.sha256(f"{label} header v0 nonce 0".encode()).digest()
        ev = chain.as_account(account).commit(run_id, 0, 0, digest).event(Committed)
        commits[label] = ev.commit_id
        say("commit", f"commit {ev.commit_id} by {account.address} digest {digest.hex()[:16]}… (block {ev.block_number})")

    for label, commit_id in commits.items():
        randomness = chain.seal_randomness_now(commit_id)
        say("seal", f"commit {commit_id} randomness {randomness.hex()[:16]}…")
        for verifier in (ver1, ver2):
            ok = label == "honest"
            ev = chain.as_account(verifier).attest(commit_id, ok, hashlib.sha256(f"evidence {label}".encode()).digest()).event(Attested)
            say("attest", f"commit {commit_id}: verifier {verifier.address} says {'pass' if ev.ok else 'FAIL'}")

    receipt = chain.slash(commits["forged"])
    slashed, jailed = receipt.event(Slashed), receipt.event(WorkerJailed)
    bounties = receipt.events_of(BountyCredited)
    say("slash", f"worker {slashed.worker} lost {slashed.amount // TOKEN} KRILL: bounty {slashed.bounty // TOKEN} to "
                 f"{len(bounties)} verifiers, {slashed.burned // TOKEN} burned; jailed={jailed.worker == cheat.address}")

    published = chain.publish_version(run_id, 1, hashlib.sha256(b"manifest v1").digest(),
                                      hashlib.sha256(b"record v1").digest()).event(VersionPublished)
    say("publish", f"version {published.version} manifest {published.manifest_digest.hex()[:16]}…")
    credited = chain.settle(run_id, 1, [honest.address], [100 * TOKEN]).events_of(RewardCredited)
    say("settle", f"version 1: {', '.join(f'{c.account} +{c.amount // TOKEN}' for c in credited)} KRILL")
    for account in (honest, ver1, ver2):
        claimed = chain.as_account(account).claim().event(Claimed)
        say("claim", f"{account.address} claimed {claimed.amount / TOKEN:g} KRILL")

    cheat_stake = chain.stake_of(cheat.address)
    report.summary = {
        "protocol": deployment.protocol,
        "commits": chain.commit_count(),
        "latest_version": chain.run_of(run_id).latest_version,
        "cheater_jailed": cheat_stake.jailed,
        "cheater_stake": cheat_stake.staked // TOKEN,
        "total_burned": chain.total_burned() // TOKEN,
        "honest_balance": chain.token.balance_of(honest.address) // TOKEN,
        "sealed_randomness_events": len(list(chain.events(deployment.block_number, kinds=(RandomnessSealed,)))),
    }
    return report
