"""`krill bench latency`: the protocol with its workers and verifiers on slow, lossy links to their chain node.

Design decisions:
- Workers and verifiers run on consumer machines across the internet, 100-300 ms from their node,
  with jitter, stalled and reset connections. Each profile is a `krill demo` run
  (`krill.bench.demo_probe`) whose workers and verifiers reach Anvil through a
  `krill.bench.lag_proxy.LagProxy` (one for the workers, one for the verifiers, both the profile,
  seeded), over HTTP and WebSocket alike (`run_demo`'s `chain_link`); the coordinator, the store and
  the database stay local, so what is measured is the chain link of the roles that are far away.
- The demo's setting otherwise: 3 workers of which one forges its rewards (so rejections and a
  verifier's failing verdict are part of the load), 1 verifier at normal priority, fresh gradients
  (a version closes at the honest workers' commits or 10 s after its parent), the tiny random model
  (the compute is small, so the chain's round trips show; on a real model they are a smaller
  share). Each profile's training budget starts once version 1 is published.
- Figures per profile: versions per minute between the first and the last version published (block
  times, 1 s resolution); contributions accepted and rejected by reason (the coordinator's index);
  the verifier's commits attested, missed, pending and skipped (its state file); the requests the
  workers' link carried between their first and last commit, per commit and by JSON-RPC method (the
  round trips a contribution costs), and the verifier's over the same window per commit; the
  stalls and resets the proxies drew; and a role that stopped (the demo's error, when a role other
  than a jailed forger stopped or the coordinator failed), in which case the profile has no
  figures and the benchmark goes on with the next.
- Sizes: `tiny` (CI smoke: 100 ms ± 20 one way, 30 s of training) and `default` (0 ms, 100 ± 20,
  300 ± 50, and 100 ± 20 with stalls of 8 s at 1% of chunks and resets at 0.3%; 90 s of training
  each; about 10 minutes on 2 cores). `link` runs one profile of `default` alone (`--link 300`): its
  figures before and after a change, run by turns on the same machine, without the other three.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

from krill.bench.demo_probe import commit_rows, model_dir, run_probed_demo, temporary_workdir
from krill.bench.lag_proxy import LagProxy, LinkProfile, LinkStats
from krill.bench.report import fmt, machine_line, pyplot, save, started

PROFILES = {
    "0 ms": LinkProfile("0 ms"),
    "100 ms": LinkProfile("100 ms", delay_s=0.1, jitter_s=0.02),
    "300 ms": LinkProfile("300 ms", delay_s=0.3, jitter_s=0.05),
    "100 ms, stalls and resets": LinkProfile("100 ms, stalls and resets", delay_s=0.1, jitter_s=0.02,
                                             stall_p=0.01, stall_s=8.0, reset_p=0.003),
}
SIZES: dict[str, dict] = {
    "tiny": {"profiles": ("100 ms",), "minutes": 0.5},
    "default": {"profiles": tuple(PROFILES), "minutes": 1.5},
}
DEMO = {"workers": 3, "adversaries": 1, "verifiers": 1, "shards": 2}
SEED = 1
VERIFIER_STATUSES = ("attested", "missed", "pending", "skipped", "error")


def version_times(db_url: str) -> list[tuple[int, int]]:
    """(version, block time) of every VersionPublished event in the index, in version order."""
    from sqlalchemy import select

    from krill.db.models import ChainEventRow
    from krill.db.session import open_database

    with open_database(db_url) as db, db.session() as s:
        rows = s.execute(select(ChainEventRow.data, ChainEventRow.block_time)
                         .where(ChainEventRow.kind == "VersionPublished")).all()
    return sorted((int(data["version"]), int(t)) for data, t in rows)


def versions_per_minute(times: list[tuple[int, int]]) -> float | None:
    """Versions published per minute between the first and the last of `times` (None under two, or no time)."""
    if len(times) < 2 or times[-1][1] <= times[0][1]:
        return None
    return 60.0 * (times[-1][0] - times[0][0]) / (times[-1][1] - times[0][1])


def contribution_outcomes(db_url: str) -> dict:
    """Contributions accepted, and rejected by reason, from the coordinator's index."""
    from sqlalchemy import func, select

    from krill.db.models import Contribution
    from krill.db.session import open_database

    out: dict = {"accepted": 0, "rejected": 0, "rejected_by_reason": {}, "other": 0}
    with open_database(db_url) as db, db.session() as s:
        for status, reason, n in s.execute(select(Contribution.status, Contribution.reason_code, func.count())
                                           .group_by(Contribution.status, Contribution.reason_code)).all():
            status = getattr(status, "value", status)
            if status == "accepted":
                out["accepted"] += n
            elif status == "rejected":
                out["rejected"] += n
                key = getattr(reason, "value", reason) or "unstated"
                out["rejected_by_reason"][key] = out["rejected_by_reason"].get(key, 0) + n
            else:
                out["other"] += n
    return out


def verifier_counts(workdir: Path) -> dict[str, int]:
    """Commits per status in every verifier's state file under the demo's home (read-only)."""
    out = dict.fromkeys(VERIFIER_STATUSES, 0)
    for path in sorted((workdir / "home").rglob("verifier-*.sqlite")):
        with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0) as conn:
            for status, n in conn.execute("SELECT status, COUNT(*) FROM commits GROUP BY status"):
                out[status] = out.get(status, 0) + n
    return out


def requests_per_commit(stats: LinkStats, commit_times: list[int]) -> dict:
    """Requests a link carried between the first and the last commit (block times, whole seconds: the
    window runs to the end of the last commit's second), per commit in the window, by method."""
    times = sorted(commit_times)
    if len(times) < 2:
        return {"commits": len(times), "window_s": None, "total": None, "methods": {}}
    per = len(times) - 1  # the requests of the first commit were sent before the window opened
    methods = stats.methods(start=times[0], end=times[-1] + 1)
    return {"commits": per, "window_s": times[-1] + 1 - times[0], "total": sum(methods.values()) / per,
            "methods": {m: n / per for m, n in methods.items()}}


class Links:
    """The proxies of one profile, made when the demo asks for its roles' chain URLs (`chain_link`)."""

    def __init__(self, profile: LinkProfile, seed: int):
        self.profile, self.seed = profile, seed
        self.proxies: dict[str, LagProxy] = {}

    def __call__(self, role: str, node_url: str) -> str:
        if role not in self.proxies:
            u = urlparse(node_url)
            self.proxies[role] = LagProxy((u.hostname, u.port), self.profile,
                                          seed=self.seed + len(self.proxies))
        return self.proxies[role].url

    def close(self) -> None:
        for proxy in self.proxies.values():
            proxy.close()

    def stats(self, role: str) -> LinkStats:
        return self.proxies[role].stats if role in self.proxies else LinkStats()


def profile_figures(demo, links: Links) -> dict:
    """The figures of one profile's demo (see the module docstring)."""
    commits = commit_rows(demo)
    commit_times = [c["block_time"] for c in commits if c["block_time"] is not None]
    times = version_times(demo.db_url)
    return {"versions": demo.summary["versions"], "versions_per_min": versions_per_minute(times),
            "version_window_s": times[-1][1] - times[0][1] if len(times) > 1 else None,
            "commits": len(commits), **contribution_outcomes(demo.db_url),
            "verifier": verifier_counts(demo.workdir),
            "worker_requests_per_commit": requests_per_commit(links.stats("worker"), commit_times),
            "verifier_requests_per_commit": requests_per_commit(links.stats("verifier"), commit_times),
            "jailed": [w["name"] for w in demo.summary["workers"] if w["jailed"]],
            "demo_seconds": round(demo.seconds, 1), "train_seconds": demo.summary.get("train_seconds")}


def profile_named(link: str) -> str:
    """The key of the profile `link` names: a key of `PROFILES`, or its one-way delay in ms ("300")."""
    for key in PROFILES:
        if link in (key, key.removesuffix(" ms")):
            return key
    raise ValueError(f"no link profile {link!r}: choose one of {', '.join(repr(k) for k in PROFILES)} "
                     "(or its delay alone, such as '300')")


def run_latency(size: str = "default", echo: Callable[[str], None] = print, keep: Path | None = None,
                link: str | None = None) -> dict:
    """One demo per link profile of `size` (only the profile `link` names, when given); figures per profile."""
    from krill.demo.orchestrate import DemoConfig
    from krill.errors import KrillError

    s = SIZES[size]
    if link is not None:
        s = {**s, "profiles": (profile_named(link),)}
    result = started(size)
    if link is not None:
        result["only"] = s["profiles"][0]
    result["settings"] = {**DEMO, "minutes": s["minutes"], "model": "tiny random Llama (hidden 32, 2 layers)",
                          "attack": "forge-rewards", "fresh_gradients": True, "seed": SEED,
                          "link": "workers and verifiers to the chain node (HTTP and WebSocket); coordinator local"}
    t0 = time.perf_counter()
    points = []
    with temporary_workdir(keep, "krill-bench-latency-") as tmp:
        root = Path(tmp)
        model = model_dir("tiny", root)
        for n, key in enumerate(s["profiles"]):
            i = n if link is None else list(PROFILES).index(key)  # one profile alone is seeded as in the full run
            profile = PROFILES[key]
            config = DemoConfig(**DEMO, minutes=s["minutes"], versions=10_000, eval_every=1000, model_dir=model,
                                release=False, explorer_port=None, audit_last=0, verifier_nice=0,
                                budget_from="first_version")
            echo(f"latency: {profile.name} ({profile.describe()}), {s['minutes']} min ...")
            links = Links(profile, seed=SEED + 10 * i)
            point = {"profile": profile.name, "link": profile.describe(), "delay_ms": profile.delay_s * 1000,
                     "jitter_ms": profile.jitter_s * 1000, "stall_p": profile.stall_p, "stall_s": profile.stall_s,
                     "reset_p": profile.reset_p, "stopped": None}
            try:
                demo = run_probed_demo(config, root / f"demo-{i}", chain_link=links)
            except KrillError as exc:
                point["stopped"] = str(exc).strip()
                echo(f"latency: {profile.name}: a role stopped: {point['stopped'].splitlines()[0]}")
            else:
                point.update(profile_figures(demo, links))
            finally:
                links.close()
            point["links"] = {role: links.stats(role).as_dict() for role in ("worker", "verifier")}
            points.append(point)
            if not point["stopped"]:
                w = point["worker_requests_per_commit"]
                echo(f"latency: {profile.name}: {fmt(point['versions_per_min'], 1)} versions/min, "
                     f"{point['accepted']} accepted, {point['rejected']} rejected, verifier "
                     f"{point['verifier']['attested']} attested / {point['verifier']['missed']} missed / "
                     f"{point['verifier']['pending']} pending, {fmt(w['total'], 1)} worker requests per commit")
    result.update(points=points, seconds=round(time.perf_counter() - t0, 1))
    return result


def _reasons(p: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(p["rejected_by_reason"].items())) or "-"


def _faults(p: dict) -> str:
    links = p["links"].values()
    return f"{sum(x['stalls'] for x in links)} / {sum(x['resets'] for x in links)}"


def markdown(r: dict) -> str:
    s = r["settings"]
    only = f", {r['only']} only" if r.get("only") else ""
    lines = [f"# krill bench latency ({r['size']}{only})", "", f"Machine: {machine_line(r)}.", "",
             f"One `krill demo` run per link profile: {s['workers']} workers ({s['adversaries']} forging its "
             f"rewards) and {s['verifiers']} verifier reach Anvil through a lagging TCP proxy each (HTTP and "
             f"WebSocket, delay per chunk one way, seeded); the coordinator, the local store and SQLite are local. "
             f"{s['model']}, {s['shards']} shards, fresh gradients, {s['minutes']} min of training from version 1.",
             "",
             "| link (one way) | versions/min | accepted | rejected (by reason) | verifier attested / missed / "
             "pending | worker requests per commit | verifier requests per commit | stalls / resets | stopped |",
             "|---|---:|---:|---|---|---:|---:|---|---|"]
    for p in r["points"]:
        if p["stopped"]:
            lines.append(f"| {p['link']} | - | - | - | - | - | - | {_faults(p)} | "
                         f"{p['stopped'].splitlines()[0]} |")
            continue
        v = p["verifier"]
        lines.append(f"| {p['link']} | {fmt(p['versions_per_min'], 1)} | {p['accepted']} | {p['rejected']} "
                     f"({_reasons(p)}) | {v['attested']} / {v['missed']} / {v['pending']} | "
                     f"{fmt(p['worker_requests_per_commit']['total'], 1)} | "
                     f"{fmt(p['verifier_requests_per_commit']['total'], 1)} | {_faults(p)} | "
                     f"{'no' if not p['jailed'] else 'no (jailed: ' + ', '.join(p['jailed']) + ')'} |")
    done = [p for p in r["points"] if not p["stopped"]]
    methods = sorted({m for p in done for m in p["worker_requests_per_commit"]["methods"]})
    if methods:
        lines += ["", "Worker chain requests per commit, by JSON-RPC method (between the first and the last commit):",
                  "", "| method | " + " | ".join(p["link"] for p in done) + " |",
                  "|---|" + "---:|" * len(done)]
        for m in methods:
            lines.append(f"| {m} | " + " | ".join(fmt(p["worker_requests_per_commit"]["methods"].get(m, 0.0), 2)
                                                  for p in done) + " |")
    lines += ["", f"Benchmark wall time: {r['seconds']:.0f} s."]
    return "\n".join(lines) + "\n"


def plots(r: dict, stem: Path) -> list[Path]:
    """Versions per minute and worker requests per commit per profile."""
    plt = pyplot()
    pts = r["points"]
    labels = [p["profile"].replace(", ", ",\n") for p in pts]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    panels = ((lambda p: p.get("versions_per_min"), "versions / min"),
              (lambda p: (p.get("worker_requests_per_commit") or {}).get("total"), "worker chain requests / commit"))
    for ax, (value, title) in zip(axes, panels, strict=True):
        ax.bar(range(len(pts)), [value(p) or 0.0 for p in pts])
        ax.set_xticks(range(len(pts)), labels)
        ax.set_title(title)
        ax.grid(True, axis="y", alpha=0.3)
    return [save(fig, stem.with_suffix(".png"))]
