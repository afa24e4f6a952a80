"""`krill bench protocol`: where a worker's and the coordinator's wall time goes, and the protocol's share.

Design decisions:
- Measured on the protocol itself: a `krill demo` run (`krill.bench.demo_probe`: Anvil, local
  store, SQLite, coordinator, honest workers and a verifier as separate processes). The roles
  record their own phases (`krill.phases`): each worker's outcome log holds, per contribution,
  rollout generation, reward, gradient, compression, rollout serialisation, hashing, signing, the
  durable save, the fetch of new versions' shards, the upload and the commit transaction with its
  receipt wait; the coordinator's metrics row of each version holds its index sync, ingest (store
  fetch, validation, cheap replay), close, publish (aggregation, optimizer, storing the content,
  the publish transaction), settle, slash and eval time since the previous version.
- Each worker's first contribution is left out of the breakdown (reported on its own as start-up):
  it loads the model, the tokenizer and the task for the first time.
- A worker's waiting is the gap between the end of one contribution's critical path and the start
  of the next (the per-version cap: a worker that has its share of a version waits for the next
  one; back-off), from the log's end times and durations, plus, for a contribution sampled ahead,
  its wait between the rollouts and the next version (`wait_version`). Its first contribution has
  no gap.
- Protocol overhead = what a worker spends beyond the RL work (rollout generation, reward,
  gradient), as a share of its busy time (waiting excluded, reported on its own): compression,
  serialisation, hashing and signing, the durable state (signed bytes and nonce), the model
  fetch, chain reads (latest version, stake, commit lookup), waiting for the previous commit,
  upload, chain transaction and confirmation, and the rest ('other': bookkeeping between
  phases). Target: under 5%.
- Busy time is the critical path. A worker submits a contribution (packaging: compression,
  serialisation, hashing and signing; the stake check when a version is new and no version
  watcher runs; durable save, upload, transaction, receipt) in a background thread while it makes
  the next (`krill.worker.pipeline`); those parts are reported as overlapped, and only what the
  main loop waited for them (`wait_submit`) counts as busy. A record without
  `seconds.foreground` (a worker submitting in line) counts whole.
- Sizes: `tiny` (CI smoke: a tiny random model, 2 workers, under a minute of training) and
  `default` (the default base model, 4 workers, 4 minutes of training; under 5 minutes in all).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

from krill.bench.demo_probe import (
    DemoResult,
    metric_rows,
    model_dir,
    run_probed_demo,
    temporary_workdir,
    worker_records,
)
from krill.bench.report import fmt, machine_line, pyplot, save, started

SIZES: dict[str, dict] = {
    "tiny": {"model": "tiny", "workers": 2, "verifiers": 1, "minutes": 0.75,
             "spec": {"version": {"contributions": 2, "deadline_s": 5.0}, "eval_n": 20}},
    "default": {"model": "base", "workers": 4, "verifiers": 1, "minutes": 4.0, "spec": {}},
}
TARGET_OVERHEAD_PCT = 5.0

# (key, label, is RL work)
WORKER_PARTS: tuple[tuple[str, str, bool], ...] = (
    ("rollout", "rollout generation", True),
    ("reward", "reward", True),
    ("gradient", "gradient", True),
    ("compress", "compression (gradient codec)", False),
    ("encode_rollouts", "rollout serialisation", False),
    ("hash_sign", "hashing and signing", False),
    ("save", "durable state: signed bytes and nonce (fsync)", False),
    ("fetch_version", "model fetch (new versions' shards)", False),
    ("chain_read", "chain reads (latest version, stake, commit lookup)", False),
    ("wait_submit", "waiting for the previous commit to land", False),
    ("stake_check", "stake check (once per new version)", False),
    ("upload", "store upload", False),
    ("chain_tx", "chain transaction (estimate, sign, send)", False),
    ("chain_confirm", "chain confirmation (receipt)", False),
    ("other", "other (bookkeeping)", False),
)
# Parts a pipelined worker runs in the background, overlapped with its next contribution.
BACKGROUND_PARTS = ("compress", "encode_rollouts", "hash_sign", "stake_check", "save", "upload", "chain_tx",
                    "chain_confirm")
# Coordinator phases: (key, label); `ingest` and `publish` are split into their parts plus a rest.
COORDINATOR_PARTS: tuple[tuple[str, str], ...] = (
    ("fetch", "fetch contributions (store)"),
    ("validate", "validate (header, signature, files, tensors)"),
    ("replay", "cheap replay (assignment, rewards)"),
    ("ingest_other", "ingest bookkeeping (database)"),
    ("close", "close (weigh, journal)"),
    ("aggregate", "aggregate (robust rule)"),
    ("optimizer", "optimizer (AdamW)"),
    ("store", "store new shards, manifest, record (optimizer states hashed)"),
    ("publish_masks", "masks of the new version (derive, store)"),
    ("publish_tx", "publish transaction"),
    ("store_states", "store optimizer states (after the transaction; every `optimizer_state_every`-th version)"),
    ("publish_other", "publish: parent and contributions load, rest"),
    ("settle", "settle rewards (transaction)"),
    ("index", "index sync (chain events)"),
    ("slash", "slash check"),
    ("prepare", "masks of the newest version (while waiting)"),
    ("index_content", "index content: headers, manifests (while waiting)"),
    ("eval", "evaluation (not protocol)"),
)


def foreground_seconds(record: dict) -> float:
    """A contribution's time in the worker's main loop: all of it for a worker that submits in line,
    up to the hand-off of its upload and commit to the background for a pipelined one."""
    s = record.get("seconds") or {}
    return float(s.get("foreground", s.get("total", 0.0)))


def version_wait(record: dict) -> float:
    """Seconds a sampled-ahead contribution waited between its rollouts and the next version (waiting, not busy)."""
    return float((record.get("phases") or {}).get("wait_version", 0.0))


def busy_seconds(record: dict) -> float:
    """A contribution's time on the worker's critical path: its main-loop time less any wait for a version."""
    return max(0.0, foreground_seconds(record) - version_wait(record))


def overlapped_parts(record: dict) -> tuple[str, ...]:
    """The parts of `record` that ran in the background (none unless the worker pipelines)."""
    return BACKGROUND_PARTS if "foreground" in (record.get("seconds") or {}) else ()


def worker_parts(record: dict) -> dict[str, float]:
    """One committed contribution's seconds per part of `WORKER_PARTS`; `other` is what its critical path
    holds beyond the named parts on it."""
    p, s = record.get("phases") or {}, record.get("seconds") or {}
    parts = {"rollout": p.get("rollout", 0.0), "reward": p.get("reward", 0.0), "gradient": p.get("gradient", 0.0),
             "compress": p.get("compress", 0.0), "encode_rollouts": p.get("encode_rollouts", 0.0),
             "hash_sign": p.get("hash", 0.0) + p.get("sign", 0.0), "save": p.get("save", 0.0),
             "fetch_version": p.get("fetch_version", 0.0), "chain_read": p.get("chain_read", 0.0),
             "wait_submit": p.get("wait_submit", 0.0), "stake_check": p.get("stake_check", 0.0),
             "upload": s.get("upload", 0.0),
             "chain_confirm": p.get("chain_confirm", 0.0)}
    parts["chain_tx"] = max(0.0, s.get("commit", 0.0) - parts["chain_confirm"])
    background = overlapped_parts(record)
    on_path = sum(v for k, v in parts.items() if k not in background)
    parts["other"] = max(0.0, busy_seconds(record) - on_path)
    return parts


def waiting_gaps(records: list[dict]) -> dict[int, float]:
    """Per record index: seconds the worker's main loop spent between its previous contribution's critical
    path and this one's start (a record's `time` is when it was logged, its start is `time - total`)."""
    gaps: dict[int, float] = {}
    by_worker: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        by_worker.setdefault(r["worker"], []).append(i)

    def start(r: dict) -> float:
        return r["time"] - r["seconds"].get("total", 0.0)

    for indices in by_worker.values():
        indices.sort(key=lambda i: start(records[i]))
        for prev, cur in zip(indices, indices[1:], strict=False):
            gaps[cur] = max(0.0, start(records[cur]) - start(records[prev]) - foreground_seconds(records[prev]))
    return gaps


def worker_breakdown(records: list[dict]) -> dict:
    """Totals, shares and per-contribution medians of the worker parts, waiting, and the protocol overhead.

    Busy time is the critical path (`foreground_seconds`); a part that ran in the background is counted
    as overlapped, not busy, and the overhead is the non-RL share of the critical path."""
    records = [r for r in records if not r.get("resumed")]
    gaps = waiting_gaps(records)
    first = {min((i for i, r in enumerate(records) if r["worker"] == w), key=lambda i: records[i]["time"])
             for w in {r["worker"] for r in records}}
    committed = [i for i, r in enumerate(records)
                 if r["status"] == "committed" and r.get("phases") and i not in first]
    per = {i: worker_parts(records[i]) for i in committed}
    background = {i: overlapped_parts(records[i]) for i in committed}
    busy = sum(busy_seconds(records[i]) for i in committed)
    dropped = sum(busy_seconds(r) for i, r in enumerate(records) if i not in per and i not in first)
    startup = [records[i]["seconds"].get("total", 0.0) for i in first]
    waiting = sum(gaps.values()) + sum(version_wait(r) for i, r in enumerate(records) if i not in first)
    rows = []
    for key, label, rl in WORKER_PARTS:
        values = [per[i][key] for i in committed]
        on_path = sum(per[i][key] for i in committed if key not in background[i])
        overlapped = sum(per[i][key] for i in committed if key in background[i])
        rows.append({"part": key, "label": label, "rl_work": rl, "seconds": on_path, "overlapped_seconds": overlapped,
                     "share_of_busy": on_path / busy if busy else None,
                     "median_ms": 1000 * statistics.median(values) if values else None})
    overhead = sum(row["seconds"] for row in rows if not row["rl_work"])
    fetch = next(row["seconds"] for row in rows if row["part"] == "fetch_version")
    wall = busy + dropped + waiting
    pipelined = sum(1 for i in committed if background[i])
    return {"contributions": len(committed), "dropped": len(records) - len(committed) - len(first),
            "pipelined": pipelined,
            "first_contribution_seconds": statistics.median(startup) if startup else None,
            "workers": len({r["worker"] for r in records}), "busy_seconds": busy, "dropped_seconds": dropped,
            "overlapped_seconds": sum(row["overlapped_seconds"] for row in rows),
            "waiting_seconds": waiting, "wall_seconds": wall, "parts": rows,
            "median_contribution_ms": 1000 * statistics.median([busy_seconds(records[i]) for i in committed])
            if committed else None,
            "overhead_pct": 100 * overhead / busy if busy else None,
            "overhead_pct_without_model_fetch": 100 * (overhead - fetch) / busy if busy else None,
            "waiting_pct_of_wall": 100 * waiting / wall if wall else None,
            "target_pct": TARGET_OVERHEAD_PCT,
            "target_met": (100 * overhead / busy < TARGET_OVERHEAD_PCT) if busy else None}


def per_contribution(w: dict) -> dict:
    """Mean RL work and protocol overhead per contribution (ms), and the RL work per contribution at
    which this overhead would be exactly the target share (the fixed costs stay, the work grows)."""
    n = w["contributions"]
    if not n:
        return {"rl_ms": None, "overhead_ms": None, "overlapped_ms": None, "break_even_rl_s": None}
    rl = sum(row["seconds"] for row in w["parts"] if row["rl_work"])
    overhead = sum(row["seconds"] for row in w["parts"] if not row["rl_work"])
    target = w["target_pct"]
    return {"rl_ms": 1000 * rl / n, "overhead_ms": 1000 * overhead / n,
            "overlapped_ms": 1000 * w.get("overlapped_seconds", 0.0) / n,
            "break_even_rl_s": overhead / n * (100 - target) / target}


def coordinator_parts(row: dict) -> dict[str, float] | None:
    """One version's coordinator seconds per part of `COORDINATOR_PARTS`, busy and wall (None without phases)."""
    p = row.get("phases")
    if not p:
        return None
    parts = {k: p.get(k, 0.0) for k in ("fetch", "validate", "replay", "close", "aggregate", "optimizer", "store",
                                        "publish_masks", "publish_tx", "store_states", "settle", "index", "slash", "prepare",
                                        "index_content", "eval")}
    parts["store"] = max(0.0, parts["store"] - parts["publish_masks"])  # the masks are stored within "store"
    parts["ingest_other"] = max(0.0, p.get("ingest", 0.0) - parts["fetch"] - parts["validate"] - parts["replay"])
    parts["publish_other"] = max(0.0, p.get("publish", 0.0) - parts["aggregate"] - parts["optimizer"]
                                 - parts["store"] - parts["publish_masks"] - parts["publish_tx"]
                                 - parts["store_states"])
    busy = sum(p.get(k, 0.0) for k in ("index", "ingest", "close", "publish", "settle", "slash", "prepare",
                                       "index_content", "eval"))
    # The coordinator's own clock when it has one (block timestamps count whole seconds).
    wall = row.get("clock_seconds", row.get("wall_seconds"))
    return parts | {"busy": busy, "wall": float(wall or 0.0), "accepted": row["accepted"]}


def coordinator_breakdown(rows: list[dict]) -> dict:
    """Per-version medians and means of the coordinator parts (version 1 left out: it carries start-up)."""
    per = [(r["version"], coordinator_parts(r)) for r in rows]
    per = [(v, x) for v, x in per if x is not None and v > 1] or [(v, x) for v, x in per if x is not None]
    out = []
    for key, label in (*COORDINATOR_PARTS, ("busy", "busy (all phases)"), ("wall", "wall time per version")):
        values = [x[key] for _, x in per]
        out.append({"part": key, "label": label, "median_ms": 1000 * statistics.median(values) if values else None,
                    "mean_ms": 1000 * statistics.fmean(values) if values else None})
    kept = {v for v, _ in per}

    def mean_of(key: str) -> float | None:  # a mean: the optimizer states come every few versions
        values = [r[key] for r in rows if r["version"] in kept and r.get(key) is not None]
        return statistics.fmean(values) if values else None

    return {"versions": len(per), "parts": out,
            "accepted_per_version": statistics.fmean([x["accepted"] for _, x in per]) if per else None,
            "bytes_received_per_version": mean_of("bytes_received"),
            "bytes_published_per_version": mean_of("bytes_published")}


def analyse(demo: DemoResult) -> dict:
    records = worker_records(demo)
    worker = worker_breakdown(records)
    worker["per_contribution"] = per_contribution(worker)
    return {"worker": worker, "coordinator": coordinator_breakdown(metric_rows(demo)),
            "demo": {"versions": demo.summary["versions"], "train_seconds": demo.summary.get("train_seconds"),
                     "wall_seconds": round(demo.seconds, 1), "verifications": demo.summary.get("verifications")}}


def run_protocol(size: str = "default", echo: Callable[[str], None] = print, keep: Path | None = None) -> dict:
    """Run the demo of `size` and break down the worker's and the coordinator's wall time."""
    from krill.demo.orchestrate import DemoConfig

    s = SIZES[size]
    result = started(size)
    t0 = time.perf_counter()
    with temporary_workdir(keep, "krill-bench-protocol-") as tmp:
        root = Path(tmp)
        model = model_dir(s["model"], root)
        config = DemoConfig(workers=s["workers"], adversaries=0, verifiers=s["verifiers"], minutes=s["minutes"],
                            shards=2, eval_every=1000, spec_overrides=s["spec"], model_dir=model, release=False,
                            explorer_port=None, audit_last=0)
        echo(f"protocol: demo with {s['workers']} honest workers, {s['verifiers']} verifier(s), "
             f"{s['minutes']} min of training on the {s['model']} model ...")
        demo = run_probed_demo(config, root / "demo", echo=lambda line: echo(f"  {line}"))
        result.update(analyse(demo))
    result["settings"] = {**s, "model_dir": str(model) if s["model"] == "base" else "tiny random Llama (hidden 32)",
                          "check_probability": "demo default (0.1)", "shards": 2}
    result["seconds"] = round(time.perf_counter() - t0, 1)
    w = result["worker"]
    echo(f"protocol: {w['contributions']} contributions; overhead {fmt(w['overhead_pct'], 1)}% of busy worker time "
         f"(target < {TARGET_OVERHEAD_PCT:g}%), waiting {fmt(w['waiting_pct_of_wall'], 1)}% of wall")
    return result


def markdown(r: dict) -> str:
    w, c, s = r["worker"], r["coordinator"], r["settings"]
    pc = per_contribution(w)
    met = "met" if w["target_met"] else "missed" if w["target_met"] is not None else "not measured"
    lines = [f"# krill bench protocol ({r['size']})", "", f"Machine: {machine_line(r)}.", "",
             f"A `krill demo` run: {s['workers']} honest workers, {s['verifiers']} verifier (check probability "
             f"{s['check_probability']}), {s['shards']} shards, model {s['model_dir']}, {s['minutes']} min of "
             f"training: {r['demo']['versions']} versions, {w['contributions']} contributions committed "
             f"({w['dropped']} dropped as stale).", "",
             "## Worker: where the wall time goes", "",
             f"Protocol overhead (everything beyond rollout generation, reward and gradient) = "
             f"**{fmt(w['overhead_pct'], 1)}%** of busy worker time (target < {w['target_pct']:g}%: {met}); "
             f"{fmt(w['overhead_pct_without_model_fetch'], 1)}% without the model fetch. Waiting (between "
             f"contributions: the per-version cap, back-off) is {fmt(w['waiting_pct_of_wall'], 1)}% of the "
             f"workers' wall time. Median contribution: {fmt(w['median_contribution_ms'], 0)} ms; each worker's "
             f"first one (loading model, tokenizer and task; left out below) took "
             f"{fmt(w['first_contribution_seconds'], 1)} s (median).", "",
             f"Per contribution (mean): RL work {fmt(pc['rl_ms'], 0)} ms, protocol overhead on the critical path "
             f"{fmt(pc['overhead_ms'], 0)} ms, and {fmt(pc['overlapped_ms'], 0)} ms of save, upload and commit "
             f"overlapped with the next contribution ({w.get('pipelined', 0)} of {w['contributions']} contributions pipelined). "
             f"The overhead is mostly a fixed cost per contribution (chain round trips, fsync, hashing), so it falls "
             f"under {w['target_pct']:g}% once the RL work per contribution exceeds about "
             f"{fmt(pc['break_even_rl_s'], 1)} s (larger models, more prompts per contribution).", "",
             "| part | RL work | on the critical path s | share of busy time | overlapped s | "
             "median per contribution (ms) |",
             "|---|---|---:|---:|---:|---:|"]
    for row in w["parts"]:
        share = None if row["share_of_busy"] is None else 100 * row["share_of_busy"]
        lines.append(f"| {row['label']} | {'yes' if row['rl_work'] else ''} | {fmt(row['seconds'], 2)} | "
                     f"{fmt(share, 1, '%')} | {fmt(row.get('overlapped_seconds') or None, 2)} | "
                     f"{fmt(row['median_ms'], 1)} |")
    lines += [f"| **busy (critical path, sum)** | | {fmt(w['busy_seconds'], 2)} | 100% | "
              f"{fmt(w.get('overlapped_seconds') or None, 2)} | {fmt(w['median_contribution_ms'], 0)} |",
              f"| waiting | | {fmt(w['waiting_seconds'], 2)} | ({fmt(w['waiting_pct_of_wall'], 1)}% of wall) | | |",
              f"| dropped work (stale) | | {fmt(w['dropped_seconds'], 2)} | | | |", "",
              f"## Coordinator: per version (median over {c['versions']} versions; "
              f"{fmt(c['accepted_per_version'], 1)} contributions folded per version)", "",
              "| part | median ms | mean ms |", "|---|---:|---:|"]
    for row in c["parts"]:
        lines.append(f"| {row['label']} | {fmt(row['median_ms'], 1)} | {fmt(row['mean_ms'], 1)} |")
    received, published = c["bytes_received_per_version"], c["bytes_published_per_version"]
    lines += ["", f"Bytes per version (mean): received {fmt(received and received / 1e3, 1)} kB (the folded "
              f"contributions), published {fmt(published and published / 1e3, 1)} kB (changed shards, masks, "
              "manifest, record, and the optimizer states where the version stores them).", "", f"Benchmark wall time: {r['seconds']:.0f} s."]
    return "\n".join(lines) + "\n"


def plots(r: dict, stem: Path) -> list[Path]:
    """Worker shares (stacked bar) and coordinator medians per version (bars)."""
    plt = pyplot()
    w, c = r["worker"], r["coordinator"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.5))
    left = 0.0
    for i, row in enumerate(w["parts"]):
        share = 100 * (row["share_of_busy"] or 0.0)
        a1.barh([0], [share], left=left, label=row["label"], hatch=None if row["rl_work"] else "//",
                color=plt.cm.tab20(i))
        left += share
    a1.set_xlim(0, 100)
    a1.set_yticks([])
    a1.set_xlabel("% of busy worker time (hatched: protocol overhead)")
    a1.set_title(f"worker: overhead {fmt(w['overhead_pct'], 1)}% (target < {w['target_pct']:g}%)")
    a1.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    parts = [row for row in c["parts"] if row["part"] not in ("busy", "wall")]
    a2.barh([row["label"] for row in parts], [row["median_ms"] or 0.0 for row in parts])
    a2.invert_yaxis()
    a2.set_xlabel("median ms per version")
    a2.set_title("coordinator per version")
    a2.tick_params(axis="y", labelsize=7)
    return [save(fig, stem.with_suffix(".png"))]
