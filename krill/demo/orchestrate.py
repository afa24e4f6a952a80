"""`krill demo`: the whole protocol on one machine, from an empty directory to a released model.

Design decisions:
- Real parts only: a real Anvil node, the local content store, SQLite, the compiled contracts, and
  every role as its own OS process driven through the same CLI an operator uses. The demo holds no
  protocol logic; it provisions, starts, watches, stops and reports.
- Participants are devnet accounts with keystores made on the spot (fast KDF, a demo password
  passed through the environment): the coordinator is the deploying admin (account 0), workers
  and verifiers the next accounts. Worker `adversary` (by default the last) forges its rewards.
- Progress comes from public data (the chain and the index the coordinator keeps), as an auditor
  would see it; the final accuracy and the release come from `krill release`.
- The base model is built (or reused) in the user's KRILL_HOME model cache, so repeated demos do
  not rebuild it; everything else lives in a fresh work directory.
- Fresh gradients by default (`DemoConfig.fresh_gradients`): each worker commits once per version
  and a version closes when every honest worker's commit is in, so every gradient is computed
  at the version it updates. Pipelined, the coordinator folded what arrived while it published,
  gradients computed one version back (mean staleness 1.0), and greedy accuracy fell by up to
  25 points for 50-100 versions mid-run in every demo of 2026-12-04; `krill train local
  --stale-gradients` reproduces that dip in one process (`krill.rl.local_train`), and fresh
  demos climbed without it.
  The workers sample ahead (`worker.sample_ahead`): their next rollouts are drawn while the
  coordinator folds, one version behind, and only the gradient waits for the new version.
- The release audits only the versions the demo audits anyway (`release --audit-last`, from
  `audit_last`; 0 releases `--unaudited`): auditing all 400 versions took about 7 minutes on a
  loaded 2-core machine, doubling the demo. The release's card names the versions not audited.
- The spec overrides are checked before anything starts (`check_spec`, as `create-run` checks its
  spec file), so a typo is not found after the model, Anvil and the keystores are set up.
- The explorer is reported only once it serves (`krill.demo.explorer`); a busy `--explorer-port`
  fails the demo before anything starts, and an explorer that dies is named with its log and left
  out of the summary, while training goes on.
- The summary counts as accepted only contributions folded into a published version: the
  coordinator may be stopped after journalling version t+1 (its accepted rows carry
  `aggregated_version` t+1) and before publishing it. Those, and contributions validated but not
  folded yet, are reported apart (`accepted_unpublished`) when there are any.
- A caller may give the workers and verifiers another RPC URL than the node's (`run_demo`'s
  `chain_link`): `krill bench latency` puts a lagging proxy there, to run them as if they were far
  from their node. The coordinator, the index sync, the audit and the release keep the node's.
- The verifiers run at a lower CPU priority (`verifier.nice` = 10): every role shares the same
  few cores here, a version waits for the workers and the coordinator, and a verifier's checks
  have a window of blocks. The benchmarks that measure the verifiers or the system's load
  (`verify`, `scale`, `detection`) run them at normal priority.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from krill.errors import KrillError

DEMO_PASSWORD = "krill-demo"
# Anvil mines a block per transaction, and the demo sends several per second: a challenge window
# of 2,000 blocks gives verifiers minutes, as 40 blocks would on a public chain. Two verifiers
# checking 10% each catch a forger within a few versions and leave the CPU to the workers.
# Contributions of 16 prompts (the spec's default is 4): on the small demo model a 4-prompt
# contribution spends most of its time in per-call overhead, 58 ms per prompt against 8 ms in one
# batch of 32. With 16, a 2.5-minute demo reached 50% in about 110 s of training where 4 took
# about 300 s (2026-12-04); 32 made versions staler and the curve unsteady.
DEMO_SPEC: dict = {"chain": {"challenge_window_blocks": 2000, "check_probability_ppm": 100_000},
                   "rollout": {"prompts_per_contribution": 16}}
TOKEN = 10**18
# Anvil answers in milliseconds and mines at once, so the roles look for news more often than the
# 0.5 s a public chain warrants. The coordinator and the workers' version watchers wake on Anvil's
# new-block announcements (`krill.chain.heads`); these intervals bound their waits between blocks,
# and are their polling periods where a node has no WebSocket (a worker waiting for a version then
# reads every 50 ms).
DEMO_POLL_S = {"coordinator": 0.1, "worker": 0.1, "verifier": 0.5}
# With fresh gradients a version waits for every honest worker's commit; if one never comes (a
# worker stopped, a commit rejected), the version closes this long after its parent instead.
FRESH_DEADLINE_S = 10.0
FIRST_VERSION_WAIT_S = 900.0  # with `budget_from="first_version"`: how long the roles may take to publish version 1


class DemoConfig(BaseModel):
    """What `krill demo` varies."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workers: int = Field(4, ge=1, le=32, description="Worker processes (up to 32: `krill bench scale`).")
    adversaries: int = Field(1, ge=0, le=16, description="How many of the workers attack (the last ones).")
    attacks: list[str] = Field(default_factory=lambda: ["forge-rewards"], min_length=1,
                               description="Strategies of the adversaries, in turn (see `krill worker run --behavior`).")
    verifiers: int = Field(2, ge=1, le=8, description="Verifier processes.")
    minutes: float = Field(12.0, gt=0, le=600, description="Training time budget (after set-up).")
    budget_from: Literal["launch", "first_version"] = Field("launch", description=(
        "When the training budget starts: at the launch of the role processes, or once version 1 is "
        "published (`krill bench scale`: 32 workers starting on 2 cores take about 80 s to import torch "
        "and transformers, which would leave little of a 90-s budget to measure)."))
    versions: int = Field(400, ge=1, description="Version budget: the coordinator stops after this version.")
    shards: int = Field(2, ge=1, le=16, description="Model shards.")
    eval_every: int = Field(10, ge=1, description="Coordinator evaluates every this many versions.")
    spec_overrides: dict = Field(default_factory=dict, description="Run-spec fields for create-run (TOML table).")
    model_dir: Path | None = Field(None, description="Local HF model to post-train (default: the built-in base model).")
    release_eval_n: int | None = Field(None, ge=1, description="Held-out prompts for the release's evals (default: the spec's).")
    release: bool = Field(True, description="Release (and evaluate) the final version at the end.")
    explorer_port: int | None = Field(0, ge=0, le=65535,
                                      description="Serve the explorer on this port (0: a free one; None: no explorer).")
    serve: bool = Field(False, description="Keep the explorer serving after the summary, until Ctrl-C.")
    audit_last: int = Field(3, ge=0, description=(
        "`krill audit` the last this many versions before the chain stops, and audit only those before "
        "releasing (`krill release --audit-last`); 0: no audit, and the release is made `--unaudited`."))
    fresh_gradients: bool = Field(True, description=(
        "Workers commit once per version and a version closes when every honest worker's commit is in "
        "(unless spec_overrides set version.contributions), so gradients are computed at the version they "
        "update; each worker samples its next rollouts while the coordinator folds (worker.sample_ahead). "
        "Off: two commits per version, folded as they come (staleness about 1)."))
    verifier_nice: int = Field(10, ge=0, le=19, description=(
        "CPU priority the verifiers give way by (verifier.nice): they check within a window of blocks, "
        "while every version waits for the workers and the coordinator on the same cores."))

    @field_validator("attacks")
    @classmethod
    def _known_attacks(cls, value: list[str]) -> list[str]:
        from krill.config import WORKER_BEHAVIORS  # the worker's strategies, named in the core

        unknown = [v for v in value if v not in WORKER_BEHAVIORS or v == "honest"]
        if unknown:
            raise ValueError(f"unknown attack(s) {unknown}; choose from "
                             f"{', '.join(sorted(set(WORKER_BEHAVIORS) - {'honest'}))}")
        return value


def demo_spec(config: DemoConfig) -> dict:
    """The run-spec overrides the demo creates its run with: the demo's, then the caller's, table by table."""
    base = {**DEMO_SPEC}
    if config.fresh_gradients:
        base["version"] = {"contributions": max(1, config.workers - config.adversaries), "deadline_s": FRESH_DEADLINE_S}
    out = {**base, **config.spec_overrides}
    for table in base:
        out[table] = {**base[table], **config.spec_overrides.get(table, {})}
    return out


def check_spec(config: DemoConfig, source: str = "spec overrides") -> None:
    """Refuse spec overrides the demo's `create-run` would refuse, before anything starts (`krill demo --spec`
    with a typo failed only after the model, Anvil and the keystores were set up). Raises `ConfigError`
    naming `source` and each key as the TOML spells it (`krill.config.validation_errors`)."""
    from pydantic import ValidationError

    from krill.config import describe_errors, validation_errors
    from krill.errors import ConfigError
    from krill.protocol.spec import RunSpec, draft_with_placeholders, staleness_clash

    overrides = config.spec_overrides
    for table in sorted(set(overrides) & (set(DEMO_SPEC) | {"version"})):  # `demo_spec` merges these table-wise
        if not isinstance(overrides[table], dict):
            raise ConfigError(f"{source}: `{table}` must be a table ([{table}] ...), "
                              f"not {type(overrides[table]).__name__}")
    for key in ("base_manifest_cid", "format", "num_shards"):
        if key in overrides:
            raise ConfigError(f"{source}: {key} is set by create-run, remove it")
    try:
        RunSpec.model_validate(draft_with_placeholders({"name": "krill-demo", **demo_spec(config),
                                                        "num_shards": config.shards}))
    except ValidationError as exc:
        raise ConfigError(f"{source}: {describe_errors(validation_errors(exc, RunSpec))}") from None
    clash = staleness_clash(overrides)  # the overrides' own bounds: create-run couples the two
    if clash:
        raise ConfigError(f"{source}: {clash}")


def spec_compression(config: DemoConfig):
    """The `CompressionConfig` the demo's run will have, as `create-run` builds the spec: the spec's
    compression table, if any, read over the run default (`krill.rl.run_defaults.over_run_default`)."""
    from krill.rl.compression import CompressionConfig
    from krill.rl.run_defaults import over_run_default

    return CompressionConfig(**over_run_default("compression", demo_spec(config).get("compression")))


def role_settings(config: DemoConfig, role: str) -> dict:
    """Settings of a worker's or verifier's config section beyond its poll interval."""
    if role == "worker" and config.fresh_gradients:
        return {"max_per_version": 1, "sample_ahead": True}
    if role == "verifier" and config.verifier_nice:
        return {"nice": config.verifier_nice}
    return {}


@dataclass
class DemoRun:
    workdir: Path
    rpc_url: str = ""
    run_id: str = ""
    configs: dict[str, Path] = field(default_factory=dict)
    behaviors: dict[str, str] = field(default_factory=dict)  # address -> behaviour
    names: dict[str, str] = field(default_factory=dict)  # address -> process name


def release_args(config: DemoConfig, config_path: Path, version: int, out: Path) -> list[str]:
    """The `krill` arguments the demo releases `version` with: audited over its last `audit_last` versions."""
    audit = ["--audit-last", str(config.audit_last)] if config.audit_last else ["--unaudited"]
    eval_n = [] if config.release_eval_n is None else ["--eval-n", str(config.release_eval_n)]
    return ["--config", str(config_path), "release", "--version", str(version), "--out", str(out), "--json",
            *audit, *eval_n]


def _write_role_config(path: Path, *, rpc_url: str, deployment, store: Path, db_url: str, keystore: Path,
                       run_id: str | None, extra: dict) -> None:
    import tomli_w

    data = {
        "chain": {"rpc_url": rpc_url, "chain_id": deployment.chain_id, "protocol_address": deployment.protocol,
                  "token_address": deployment.token, "deploy_block": deployment.block_number},
        "store": {"type": "local", "path": str(store)},
        "database": {"url": db_url},
        "keystore": {"path": str(keystore)},
        **({"run": {"id": run_id}} if run_id else {}),
        **extra,
    }
    path.write_text(tomli_w.dumps(data), encoding="utf-8")


def run_demo(config: DemoConfig, workdir: Path, echo: Callable[[str], None],
             on_summary: Callable[[dict], None] | None = None,
             earlier: list[tuple[Path, int]] | None = None,
             chain_link: Callable[[str, str], str] | None = None) -> dict:
    """Run the demo in `workdir`; returns the summary (also written to workdir/summary.json).

    `on_summary` sees the summary as soon as it exists (before `serve` keeps the explorer up);
    `earlier` (earlier demo directories and their bytes) is named when the disk is too full;
    `chain_link(role, node_url)` gives the RPC URL a `worker` or `verifier` reaches the node at (its
    config's `chain.rpc_url`, for everything it runs: stake and run), where it is not the node's own
    (`krill bench latency`: a lagging link). The coordinator, the index sync, the audit and the release
    always use the node's."""
    from krill.chain.anvil import AnvilProcess
    from krill.chain.devnet import provision
    from krill.chain.rpc import dev_accounts
    from krill.config import CoordinatorConfig
    from krill.demo.disk import DenseStart, check_space, gigabytes, store_contents
    from krill.demo.explorer import ExplorerNotServing, check_port_free, start_explorer
    from krill.demo.processes import ProcessGroup, interrupt_on_signals
    from krill.keystore import KdfCost, create_keystore
    from krill.model.base import ensure_base_model

    check_spec(config)  # before anything starts
    started = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    home = workdir / "home"
    env = {**os.environ, "KRILL_HOME": str(home), "KRILL_KEYSTORE__PASSWORD": DEMO_PASSWORD}
    env.pop("KRILL_CONFIG", None)
    run = DemoRun(workdir)
    summary_extra: dict = {}

    if config.model_dir is not None:
        model_dir = config.model_dir
    else:
        echo("building (or reusing) the base model ...")
        model_dir = ensure_base_model(progress=lambda step, loss, acc: echo(
            f"  warm start step {step}: loss {loss:.3f}, held-out accuracy {acc:.3f}"))

    every = CoordinatorConfig.model_fields["optimizer_state_every"].default  # the demo coordinator's
    dense = DenseStart.of(spec_compression(config), config.workers)
    need = check_space(workdir, Path(model_dir), config.versions, every, earlier, dense)
    echo(f"the store will take up to about {gigabytes(need)} in {workdir} "
         f"({store_contents(every, dense, config.versions)})")
    if config.explorer_port:  # asked for explicitly: a busy port fails now, not after the set-up
        check_port_free(config.explorer_port)
    n = 1 + config.workers + config.verifiers  # funded dev accounts: coordinator, workers, verifiers
    # SIGTERM/SIGHUP stop the demo as a Ctrl-C does (`interrupt_on_signals`), while Anvil and the roles run.
    with interrupt_on_signals(), \
            AnvilProcess.start(log_path=workdir / "logs" / "anvil.log", accounts=max(20, n)) as node, \
            ProcessGroup(workdir / "logs", env) as procs:
        run.rpc_url = node.rpc_url
        deployment = provision(node.rpc_url, accounts=max(20, n))
        echo(f"chain {node.rpc_url} (Anvil pid {node.pid}); KrillProtocol {deployment.protocol}")
        accounts = dev_accounts(n)
        roles = [("coordinator", "coordinator")] + [("worker", f"worker-{i}") for i in range(config.workers)] + \
                [("verifier", f"verifier-{i}") for i in range(config.verifiers)]
        db_url = f"sqlite:///{workdir / 'krill.db'}"
        keystores = {}
        for (role, name), account in zip(roles, accounts, strict=True):
            info = create_keystore(name, DEMO_PASSWORD, directory=workdir / "keys", private_key=bytes(account.key),
                                   cost=KdfCost.FAST, overwrite=True)
            keystores[name] = info.path
            run.names[account.address.lower()] = name
            if role == "worker":
                k = int(name.split("-")[1]) - (config.workers - config.adversaries)
                run.behaviors[account.address.lower()] = config.attacks[k % len(config.attacks)] if k >= 0 else "honest"

        def write_configs(run_id: str | None) -> None:
            for role, name in roles:
                extra = {"coordinator": {"eval_every": config.eval_every, "max_versions": config.versions,
                                         "poll_interval_s": DEMO_POLL_S["coordinator"]}} \
                    if role == "coordinator" else {role: {"poll_interval_s": DEMO_POLL_S[role], **role_settings(config, role)}}
                path = workdir / f"{name}.toml"
                rpc_url = chain_link(role, node.rpc_url) if chain_link is not None and role != "coordinator" \
                    else node.rpc_url
                _write_role_config(path, rpc_url=rpc_url, deployment=deployment, store=workdir / "store",
                                   db_url=db_url, keystore=keystores[name], run_id=run_id, extra=extra)
                run.configs[name] = path

        write_configs(None)
        echo("creating the run (publishing the base model and run spec) ...")
        spec_file = workdir / "spec.toml"
        import tomli_w

        spec_file.write_text(tomli_w.dumps(demo_spec(config)), encoding="utf-8")
        out = procs.run("create-run", ["--config", str(run.configs["coordinator"]), "coordinator", "create-run",
                                       "--name", "krill-demo", "--shards", str(config.shards), "--fund", "20000", "--model",
                                       str(model_dir), "--spec", str(spec_file), "--json"])
        run.run_id = _last_json(out)["run_id"]
        write_configs(run.run_id)
        echo(f"run {run.run_id}")
        for role, name in roles[1:]:
            procs.run(f"stake-{name}", ["--config", str(run.configs[name]), role, "stake"])
        attacks = sorted({b for b in run.behaviors.values() if b != "honest"})
        echo(f"staked {config.workers} workers ({config.adversaries} attacking: {', '.join(attacks) or 'none'}) "
             f"and {config.verifiers} verifiers")

        if config.explorer_port is not None:
            try:
                url = start_explorer(procs, run.configs["coordinator"], db_url, config.explorer_port,
                                     workdir / "summary.json")
            except ExplorerNotServing as exc:
                echo(f"{exc}; the demo goes on without it")
            else:
                summary_extra["explorer"] = url
                echo(f"explorer: {url} (read-only pages and JSON API over the run's index)")
        coordinator = procs.krill("coordinator", ["--config", str(run.configs["coordinator"]), "coordinator", "run"])
        for role, name in roles[1:]:
            args = ["--config", str(run.configs[name]), role, "run"]
            if role == "worker":
                address = next(a for a, nm in run.names.items() if nm == name)
                args += ["--behavior", run.behaviors[address]]
            procs.krill(name, args)
        train_started = time.monotonic()
        deadline = train_started + 60 * config.minutes if config.budget_from == "launch" else None
        watcher = ProgressWatcher(db_url, run.run_id, echo)
        while (deadline is None or time.monotonic() < deadline) and coordinator.running():
            watcher.poll()
            if deadline is None and watcher.shown >= 1:
                deadline = time.monotonic() + 60 * config.minutes
            elif deadline is None and time.monotonic() - train_started > FIRST_VERSION_WAIT_S:
                raise KrillError(f"no version published within {FIRST_VERSION_WAIT_S:.0f} s of starting the roles:\n"
                                 f"{coordinator.tail()}")
            # An adversary stops once jailed (that is the protocol working); anyone else stopping is a fault.
            adversaries = {run.names[a] for a, b in run.behaviors.items() if b != "honest"}
            dead = [c for c in procs.children if c.name.split("-")[0] in ("worker", "verifier")
                    and c.name not in adversaries and not c.running()]
            if dead:
                raise KrillError(f"{dead[0].name} stopped unexpectedly:\n{dead[0].tail()}")
            time.sleep(2.0)
        watcher.poll()
        if not coordinator.running() and coordinator.popen.returncode not in (0, None):
            raise KrillError(f"the coordinator failed:\n{coordinator.tail()}")
        procs.stop_all(keep=("explorer",))  # the explorer serves the finished run until the demo ends
        train_seconds = time.monotonic() - train_started
        # The coordinator may have published a version on chain and been stopped before its index saw it:
        # one more sync, so the summary, the release and the audit all name the chain's last version.
        procs.run("index-sync", ["--config", str(run.configs["coordinator"]), "index", "sync"], timeout=300)

        summary = collect_summary(db_url, run)
        final = summary["versions"]
        echo(f"training stopped after {train_seconds / 60:.1f} min at version {final}"
             + ("; releasing ..." if config.release else ""))
        unpublished = summary.get("accepted_unpublished")
        if unpublished:
            folded = ", ".join(str(v) for v in unpublished["versions"])
            echo(f"{unpublished['contributions']} accepted contribution(s) are in no published version, so not counted "
                 "as accepted: " + (f"folded into version(s) {folded}, which the coordinator journalled but had not "
                                    "published when it stopped, or " if folded else "") + "validated but not folded yet")
        if config.release:
            out = procs.run("release", release_args(config, run.configs["coordinator"], final, workdir / "release"),
                            timeout=900)
            release = _last_json(out)
            summary.update(base_accuracy=release["evals"]["base"]["accuracy"],
                           final_accuracy=release["evals"]["version"]["accuracy"], release_cid=release["cid"])
        if config.audit_last and final:
            # The devnet lives as long as the demo: audit now, from chain + store only, as anyone could.
            echo(f"auditing the last {min(config.audit_last, final)} version(s) from public data ...")
            audited = procs.run("audit", ["--config", str(run.configs["coordinator"]), "audit", "--last",
                                          str(config.audit_last), "--json"], timeout=900, ok_exit=(0, 1))
            report = _last_json(audited)
            summary["audit"] = {"ok": report["ok"], "versions": [v["version"] for v in report["versions"]],
                                "failures": [f"v{v['version']}: {c['name']}" for v in report["versions"]
                                             for c in v["checks"] if not c["ok"]]}
        summary.update(wall_seconds=round(time.monotonic() - started, 1), train_seconds=round(train_seconds, 1),
                       run_id=run.run_id, workdir=str(workdir), **summary_extra)
        (workdir / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
        explorer = next((c for c in procs.children if c.name == "explorer"), None)
        summary["serving"] = bool(config.serve and explorer is not None and explorer.running())
        if on_summary is not None:
            on_summary(summary)
        if summary["serving"]:
            echo(f"serving the explorer at {summary_extra['explorer']} until Ctrl-C ...")
            try:
                while explorer.running():
                    time.sleep(1.0)
            except KeyboardInterrupt:
                pass
    return summary


def _last_json(output: str) -> dict:
    for line in reversed(output.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise KrillError(f"expected a JSON line in the output:\n{output[-2000:]}")


class ProgressWatcher:
    """One line per newly published version, read from the shared index."""

    def __init__(self, db_url: str, run_id: str, echo: Callable[[str], None]):
        self.db_url, self.run_id, self.echo = db_url, run_id.removeprefix("0x").lower(), echo
        self.shown = -1
        self.db = None

    def poll(self) -> None:
        from sqlalchemy import func, select

        from krill.db.models import Contribution, ContributionStatus, Eval, Metric, Slash, Verdict
        from krill.db.session import open_database

        if self.db is None:
            self.db = open_database(self.db_url)
        with self.db.session() as s:
            rows = s.execute(select(Metric).where(Metric.run_id == self.run_id, Metric.version > self.shown)
                             .order_by(Metric.version)).scalars().all()
            for m in rows:
                ev = s.execute(select(Eval.accuracy).where(Eval.run_id == self.run_id, Eval.version == m.version)
                               ).scalar_one_or_none()
                rejected = s.scalar(select(func.count()).select_from(Contribution).where(
                    Contribution.run_id == self.run_id, Contribution.status == ContributionStatus.REJECTED)) or 0
                verdicts = s.scalar(select(func.count()).select_from(Verdict)) or 0
                failed = s.scalar(select(func.count()).select_from(Verdict).where(Verdict.ok.is_(False))) or 0
                slashes = s.scalar(select(func.count()).select_from(Slash)) or 0
                acc = f"{ev:.3f}" if ev is not None else "  -  "
                self.echo(f"v{m.version:4d}  accepted {m.accepted:2d}  reward {m.mean_reward or 0:.3f}  eval {acc}  "
                          f"staleness {m.mean_staleness or 0:.2f}  rejected(total) {rejected}  verdicts {verdicts} "
                          f"(failed {failed})  slashes {slashes}")
                self.shown = m.version


def collect_summary(db_url: str, run: DemoRun) -> dict:
    """Per-worker outcomes and verification counts, from the index. "accepted" counts contributions folded
    into a published version (aggregated_version <= the run's latest); accepted ones in no published
    version are counted apart, per worker and in "accepted_unpublished", where there are any. "trust" is
    the trust the coordinator weighed the worker's newest contribution in a published version at (none
    before one): the index's tally of every verdict is not trust, as any staked account can raise it."""
    from sqlalchemy import func, select

    from krill.db.models import Contribution, ContributionStatus, Participant, Run, Slash, Verdict
    from krill.db.session import open_database

    run_id = run.run_id.removeprefix("0x").lower()
    with open_database(db_url) as db, db.session() as s:
        latest = s.execute(select(Run.latest_version).where(Run.run_id == run_id)).scalar_one()
        published = Contribution.aggregated_version.is_not(None) & (Contribution.aggregated_version <= latest)
        accepted = (Contribution.run_id == run_id) & (Contribution.status == ContributionStatus.ACCEPTED)
        workers = []
        for address, behavior in sorted(run.behaviors.items(), key=lambda kv: run.names[kv[0]]):
            p = s.get(Participant, address)

            def count(*where, address=address):
                return s.scalar(select(func.count()).select_from(Contribution).where(
                    Contribution.run_id == run_id, Contribution.worker == address, *where)) or 0

            slashed = s.scalar(select(func.count()).select_from(Slash).where(Slash.worker == address)) or 0
            weighed = s.scalar(select(Contribution.trust).where(
                accepted, published, Contribution.worker == address, Contribution.trust.is_not(None))
                .order_by(Contribution.commit_id.desc()).limit(1))
            pending = count(accepted, ~published)
            workers.append({"name": run.names[address], "address": address, "behavior": behavior,
                            "accepted": count(accepted, published),
                            **({"accepted_unpublished": pending} if pending else {}),
                            "rejected": count(Contribution.status == ContributionStatus.REJECTED),
                            "slashed": slashed, "jailed": bool(p.jailed) if p else False,
                            "trust": round(weighed, 4) if weighed is not None else None,
                            "rewards": (p.rewards_credited / TOKEN) if p else 0.0})
        unpublished = s.scalar(select(func.count()).select_from(Contribution).where(accepted, ~published)) or 0
        versions = s.scalars(select(Contribution.aggregated_version).distinct().where(
            accepted, Contribution.aggregated_version > latest).order_by(Contribution.aggregated_version)).all()
        checked = s.scalar(select(func.count()).select_from(Verdict)) or 0
        failed = s.scalar(select(func.count()).select_from(Verdict).where(Verdict.ok.is_(False))) or 0
    summary = {"versions": int(latest), "workers": workers, "verifications": {"checked": checked, "failed": failed}}
    if unpublished:
        summary["accepted_unpublished"] = {"contributions": unpublished, "versions": [int(v) for v in versions]}
    return summary
