"""Run a `krill demo` for a benchmark and read back what it measured: role logs, the index, probes.

Design decisions:
- Benchmarks of the protocol run the protocol: `krill.demo.orchestrate.run_demo` (Anvil, the
  local store, SQLite, every role as its own OS process), without explorer, release or audit.
  Figures are read afterwards from where the roles keep them: each worker's outcome log
  (`contributions.jsonl`, with its phases per contribution, `krill.phases`), the coordinator's
  `metrics` rows (phases per version), the evidence documents of verdicts (ms per check stage),
  and the shared index (commits, block times, contribution statuses).
- A probe thread samples while the demo runs, without touching it: the peak resident memory
  (`VmHWM` in /proc/<pid>/status, which only grows, so the last sample before a process ends is
  its peak) of every process whose command line names the demo's work directory (each role runs
  with `--config <workdir>/<name>.toml`), and the index lag: the chain head minus the last block
  the shared index has read (`index_meta.next_block - 1`), in blocks and in seconds since the
  probe first saw the head pass the indexed block.
- Everything lives in a temporary work directory, removed afterwards unless `keep` is given.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

NAME = re.compile(r"/((?:coordinator|worker|verifier)(?:-\d+)?)\.toml$")
TINY_SHAPE = {"hidden": 32, "layers": 2, "heads": 2, "intermediate": 64}  # the tiny random model of `model_dir`


def percentile(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) by linear interpolation; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summary_stats(values: list[float]) -> dict:
    """n, mean, median, p95 and max of `values` (None when empty)."""
    if not values:
        return {"n": 0, "mean": None, "median": None, "p95": None, "max": None}
    return {"n": len(values), "mean": statistics.fmean(values), "median": statistics.median(values),
            "p95": percentile(values, 0.95), "max": max(values)}


@dataclass
class Probe:
    """Samples peak memory per role process and the index lag while a demo runs."""

    workdir: Path
    interval_s: float = 0.5
    peak_kib: dict[str, int] = field(default_factory=dict)   # process name -> VmHWM (KiB)
    lag: list[tuple[float, int, int]] = field(default_factory=list)  # (t, head, indexed)
    _seen: dict[int, float] = field(default_factory=dict)    # block -> first time the head reached it
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Probe:
        self._thread = threading.Thread(target=self._loop, name="krill-bench-probe", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _loop(self) -> None:
        rpc = None
        while not self._stop.is_set():
            self._memory()
            if rpc is None:
                rpc = self._rpc_url()
            if rpc is not None:
                self._index_lag(rpc)
            self._stop.wait(self.interval_s)
        self._memory()

    def _memory(self) -> None:
        needle = str(self.workdir)
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if needle not in cmd:
                    continue
                match = next((NAME.search(part) for part in cmd.split() if NAME.search(part)), None)
                if match is None:
                    continue
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:  # the process ended between listing and reading
                continue
            hwm = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)
            if hwm:
                name = match.group(1)
                if " run" not in cmd:  # create-run, stake: short set-up commands, not the role's loop
                    name = f"{name} (set-up)"
                self.peak_kib[name] = max(self.peak_kib.get(name, 0), int(hwm.group(1)))

    def _rpc_url(self) -> str | None:
        import tomllib

        path = self.workdir / "coordinator.toml"
        try:
            return tomllib.loads(path.read_text())["chain"]["rpc_url"]
        except (OSError, KeyError, ValueError):
            return None

    def _index_lag(self, rpc: str) -> None:
        import httpx

        db = self.workdir / "krill.db"
        try:
            head = int(httpx.post(rpc, json={"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber", "params": []},
                                  timeout=2.0).json()["result"], 16)
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.5) as conn:
                row = conn.execute("SELECT next_block FROM index_meta WHERE id = 1").fetchone()
        except (httpx.HTTPError, sqlite3.Error, KeyError, ValueError):
            return
        now = time.monotonic()
        for block in range(max(self._seen, default=head - 1) + 1, head + 1):
            self._seen[block] = now
        if row is not None:
            self.lag.append((now, head, int(row[0]) - 1))

    def lag_figures(self) -> dict:
        """Index lag in blocks and seconds: median, p95, max over the samples."""
        blocks = [max(0, head - indexed) for _, head, indexed in self.lag]
        seconds = [max(0.0, t - self._seen.get(indexed + 1, t)) if head > indexed else 0.0
                   for t, head, indexed in self.lag]
        return {"samples": len(self.lag), "blocks": summary_stats(blocks), "seconds": summary_stats(seconds)}

    def memory_by_role(self) -> dict:
        """Peak resident memory (MiB) per role: max and mean over its processes, and the processes."""
        roles: dict[str, list[float]] = {}
        for name, kib in self.peak_kib.items():
            if "(set-up)" in name:
                continue
            roles.setdefault(name.split("-")[0], []).append(kib / 1024)
        return {role: {"processes": len(v), "max_mib": max(v), "mean_mib": statistics.fmean(v),
                       "total_mib": sum(v)} for role, v in sorted(roles.items())}


@dataclass
class DemoResult:
    """What one benchmark demo left behind (read before its work directory goes)."""

    summary: dict
    workdir: Path
    db_url: str
    run_id: str
    probe: Probe
    seconds: float


def run_probed_demo(config, workdir: Path, echo=lambda line: None, chain_link=None) -> DemoResult:
    """`run_demo(config)` in `workdir` with a `Probe` sampling alongside (`chain_link`: see `run_demo`)."""
    from krill.demo.orchestrate import run_demo

    started = time.perf_counter()
    with Probe(workdir) as probe:
        summary = run_demo(config, workdir, echo=echo, chain_link=chain_link)
    return DemoResult(summary, workdir, f"sqlite:///{workdir / 'krill.db'}", summary["run_id"].removeprefix("0x"),
                      probe, time.perf_counter() - started)


def model_dir(kind: str, root: Path) -> Path:
    """The default base model (built or reused in the user's model cache), or a tiny random one under `root`."""
    if kind == "base":
        from krill.model.base import ensure_base_model

        return ensure_base_model()
    from krill.model.build import TinyModelSpec, build_tiny_model

    directory = root / "tiny-model"
    if not directory.exists():
        build_tiny_model(seed=1, spec=TinyModelSpec(**TINY_SHAPE), directory=directory)
    return directory


def worker_records(result: DemoResult) -> list[dict]:
    """Every worker's outcome log lines, each with its `worker` address added."""
    out = []
    for path in sorted((result.workdir / "home" / "worker").glob("*/runs/*/contributions.jsonl")):
        worker = path.parts[-4]
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line) | {"worker": worker})
            except ValueError:
                continue
    return out


def metric_rows(result: DemoResult) -> list[dict]:
    """The coordinator's per-version metrics rows, in version order."""
    from sqlalchemy import select

    from krill.db.models import Metric
    from krill.db.session import open_database

    with open_database(result.db_url) as db, db.session() as s:
        rows = s.scalars(select(Metric).where(Metric.run_id == result.run_id).order_by(Metric.version)).all()
        return [{"version": m.version, "accepted": m.accepted, "rejected": m.rejected,
                 "wall_seconds": m.wall_seconds, "bytes_received": m.bytes_received,
                 "bytes_published": m.bytes_published, "sampled_tokens": m.sampled_tokens, **(m.extra or {})}
                for m in rows]


def commit_rows(result: DemoResult) -> list[dict]:
    """Every commit of the run: id, worker, digest, block, block time, and the coordinator's status."""
    from sqlalchemy import select

    from krill.db.models import ChainEventRow, Commit, Contribution
    from krill.db.session import open_database

    with open_database(result.db_url) as db, db.session() as s:
        times = dict(s.execute(select(ChainEventRow.commit_id, ChainEventRow.block_time)
                               .where(ChainEventRow.kind == "Committed")).all())
        status = {c.commit_id: c for c in s.scalars(select(Contribution).where(Contribution.run_id == result.run_id))}
        return [{"commit_id": c.commit_id, "worker": c.worker, "digest": c.header_digest, "block": c.block_number,
                 "block_time": times.get(c.commit_id),
                 "status": status[c.commit_id].status.value if c.commit_id in status else None,
                 "aggregated_version": status[c.commit_id].aggregated_version if c.commit_id in status else None}
                for c in s.scalars(select(Commit).where(Commit.run_id == result.run_id).order_by(Commit.commit_id))]


def evidence_rows(result: DemoResult) -> list[dict]:
    """Every verdict's evidence document (from the demo's store): commit, digest, verdict, ms per stage."""
    from sqlalchemy import select

    from krill.db.models import Commit, Verdict
    from krill.db.session import open_database
    from krill.protocol.evidence import load_evidence
    from krill.store.cid import digest_to_cid
    from krill.store.local import LocalStore

    store = LocalStore(result.workdir / "store")
    with open_database(result.db_url) as db, db.session() as s:
        verdicts = s.execute(select(Verdict.commit_id, Verdict.verifier, Verdict.evidence_digest, Commit.header_digest)
                             .join(Commit, Commit.commit_id == Verdict.commit_id)).all()
    out = []
    for commit_id, verifier, evidence_digest, header_digest in verdicts:
        evidence = load_evidence(store, digest_to_cid(bytes.fromhex(evidence_digest)))
        out.append({"commit_id": commit_id, "verifier": verifier, "digest": header_digest, "ok": evidence.ok,
                    "reason": evidence.reason, "checks": [{"name": c.name, "ok": c.ok, "ms": c.ms, "figures": c.figures}
                                                          for c in evidence.checks]})
    return out


def temporary_workdir(keep: Path | None, prefix: str):
    """A context manager giving `keep` (created) or a fresh temporary directory removed afterwards."""
    from contextlib import nullcontext

    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        return nullcontext(str(keep))
    return tempfile.TemporaryDirectory(prefix=prefix)
