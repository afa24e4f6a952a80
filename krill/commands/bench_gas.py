"""`krill bench gas`: gas used by each Krill contract call, measured on a fresh Anvil.

Design decisions:
- The benchmark starts its own Anvil (pinned binary, free port, stopped by PID), deploys the
  committed artifacts and plays one protocol round; every figure is the `gasUsed` of a real
  receipt, so it includes the 21,000 base cost and calldata, as a participant pays it.
- Each call is measured in its common case: a first stake, a fresh commit, a failing attestation
  (the dearer verdict: it is remembered for the bounty), a slash that pays two verifiers
  (quorum 2), a publication, and a settlement of `--batch-size` accounts never credited before
  (cold storage, the worst case), reported per account and in total.
- Gas does not depend on the machine, but the compiler settings do: they are printed too, and the
  machine is stated anyway, as every benchmark does (`machine` in the JSON, a line under the table).
"""

from __future__ import annotations

import hashlib
import json

import click

LABELS = {
    "stake": "stake (first, worker)",
    "requestUnstake": "requestUnstake",
    "withdraw": "withdraw",
    "commit": "commit",
    "sealRandomness": "sealRandomness (first)",
    "attest": "attest (failing verdict)",
    "attestPass": "attest (passing verdict)",
    "slash": "slash (2 verifiers paid)",
    "publishVersion": "publishVersion",
    "settle": "settle, per account",
    "settleBatch": "settle, whole batch",
    "claim": "claim",
    "createRun": "createRun",
    "fundRewards": "fundRewards",
}


def _digest(label: str) -> bytes:
    return hashlib.sha256(label.encode()).digest()


def measure_gas(rpc_url: str, batch_size: int = 16) -> dict:
    """Play one round on the node at `rpc_url` (a fresh devnet) and return gas per call."""
    from krill.chain.client import KrillChain
    from krill.chain.deploy import TOKEN, deploy
    from krill.chain.rpc import connect_http, dev_accounts, mine
    from krill.chain.types import Role, RunParams

    w3 = connect_http(rpc_url)
    accounts = dev_accounts(7)
    admin, coordinator, worker, verifier_a, verifier_b, verifier_c, funder = accounts
    deployment = deploy(w3, admin, unbonding_blocks=20)
    chain = KrillChain(w3, deployment.protocol, admin)
    for account in accounts:
        chain.token.mint(account.address, 10_000 * TOKEN)
        chain.as_account(account).token.approve(deployment.protocol, 2**256 - 1)
    run_id = _digest("gas run")
    params = RunParams(coordinator=coordinator.address, max_staleness=2, attestation_quorum=2,
                       slash_fraction_bps=5_000, verifier_bounty_bps=2_000, check_probability_ppm=100_000,
                       challenge_window_blocks=10, reward_per_version=5_000 * TOKEN)
    gas: dict[str, int] = {}
    gas["createRun"] = chain.create_run(run_id, _digest("base"), params).gas_used
    gas["fundRewards"] = chain.as_account(funder).fund_rewards(run_id, 5_000 * TOKEN).gas_used
    w = chain.as_account(worker)
    gas["stake"] = w.stake(Role.WORKER, 200 * TOKEN, _digest("worker key")).gas_used
    for i, v in enumerate((verifier_a, verifier_b, verifier_c)):
        chain.as_account(v).stake(Role.VERIFIER, 200 * TOKEN, _digest(f"verifier key {i}"))
    receipt = w.commit(run_id, 0, 1, _digest("header 1"))
    gas["commit"] = receipt.gas_used
    commit_id = receipt.events[0].commit_id
    mine(w3, 1)  # the randomness block must exist before sealing
    gas["sealRandomness"] = chain.as_account(verifier_a).seal_randomness(commit_id).gas_used
    gas["attest"] = chain.as_account(verifier_a).attest(commit_id, False, _digest("evidence a")).gas_used
    chain.as_account(verifier_b).attest(commit_id, False, _digest("evidence b"))
    gas["attestPass"] = chain.as_account(verifier_c).attest(commit_id, True, _digest("evidence c")).gas_used
    c = chain.as_account(coordinator)
    gas["slash"] = c.slash(commit_id).gas_used
    gas["publishVersion"] = c.publish_version(run_id, 1, _digest("manifest 1"), _digest("record 1")).gas_used
    recipients = [w3.to_checksum_address(_digest(f"recipient {i}")[:20]) for i in range(batch_size)]
    total = c.settle(run_id, 1, recipients, [TOKEN] * batch_size).gas_used
    gas["settleBatch"] = total
    gas["settle"] = round(total / batch_size)
    gas["claim"] = chain.as_account(verifier_a).claim().gas_used
    gas["requestUnstake"] = chain.as_account(verifier_c).request_unstake(50 * TOKEN).gas_used
    mine(w3, 20)
    gas["withdraw"] = chain.as_account(verifier_c).withdraw().gas_used
    return gas


def run_bench(batch_size: int) -> dict:
    """Start Anvil, measure, stop it; figures plus the settings that produced them."""
    from krill.bench_env import machine_facts
    from krill.chain.anvil import AnvilProcess
    from krill.chain.artifacts import load_artifact

    with AnvilProcess.start() as node:
        gas = measure_gas(node.rpc_url, batch_size)
    artifact = load_artifact("KrillProtocol")
    return {**gas, "settleBatchSize": batch_size, "compiler": artifact.compiler_version,
            "evmVersion": artifact.settings["evmVersion"], "node": "anvil 1.7.1", "machine": machine_facts()}


@click.command("gas")
@click.option("--batch-size", default=16, show_default=True, type=click.IntRange(1, 64),
              help="Accounts credited by the measured settle call.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def gas(batch_size: int, as_json: bool) -> None:
    """Gas used by stake, commit, attest, slash, publishVersion, settle and more, on Anvil."""
    results = run_bench(batch_size)
    if as_json:
        click.echo(json.dumps(results, indent=2, sort_keys=True))
        return
    from rich.console import Console
    from rich.table import Table

    from krill.bench.report import machine_summary

    table = Table(title=f"krill bench gas (Anvil, solc {results['compiler']}, evm {results['evmVersion']})")
    table.add_column("call")
    table.add_column("gas used", justify="right")
    for key, label in LABELS.items():
        shown = f"{label} ({batch_size} accounts)" if key == "settleBatch" else label
        table.add_row(shown, f"{results[key]:,}")
    console = Console()
    console.print(table)
    console.print(f"Machine: {machine_summary(results['machine'])}", markup=False, soft_wrap=True)
