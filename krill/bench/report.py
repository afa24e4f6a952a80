"""What every benchmark of issue 8 writes: JSON, markdown and PNG plots under one stem, with the machine.

Design decisions:
- Each benchmark module returns one JSON-able dict and renders it (`markdown`, `plots`); this
  module only adds the common parts: the machine (`krill.bench_env.machine_facts`) and the load
  average at the start and the end (the machine is shared, so a reader must see how busy it
  was), the file names (`<name>.json/.md/.png`; `--tiny` writes `<name>-tiny.*` so a smoke run
  never overwrites the committed default-size results) and the matplotlib Agg backend.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path


def loadavg() -> list[float]:
    """The 1, 5 and 15-minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


def started(size: str) -> dict:
    """The common head of a result: size, machine and load average now."""
    from krill.bench_env import machine_facts

    return {"size": size, "machine": machine_facts(), "loadavg_start": loadavg()}


def machine_summary(m: dict) -> str:
    """`krill.bench_env.machine_facts` in one line: cores, memory, platform, versions, date."""
    v = m["versions"]
    return (f"{m['usable_cpus']} usable CPUs of {m['cpu_count']}, {m['memory_gib']} GiB, {m['platform']}, "
            f"Python {m['python']}, torch {v.get('torch')}, web3 {v.get('web3')}; {m['date_utc']}")


def machine_line(r: dict) -> str:
    load = f"load average (1/5/15 min) {r['loadavg_start']} at the start, {r.get('loadavg_end')} at the end"
    return f"{machine_summary(r['machine'])}; {load}"


def stem_for(out_dir: Path, name: str, size: str) -> Path:
    return out_dir / (name if size == "default" else f"{name}-{size}")


def write(result: dict, out_dir: Path, name: str, markdown: Callable[[dict], str],
          plots: Callable[[dict, Path], list[Path]]) -> tuple[str, list[Path]]:
    """Finish `result` (load average at the end) and write `<stem>.json`, `<stem>.md` and the plots."""
    result["loadavg_end"] = loadavg()
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = stem_for(out_dir, name, result["size"])
    text = markdown(result)
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2, sort_keys=True, default=str) + "\n")
    stem.with_suffix(".md").write_text(text)
    return text, [stem.with_suffix(".json"), stem.with_suffix(".md"), *plots(result, stem)]


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> Path:
    plt = pyplot()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def fmt(x, digits: int = 1, unit: str = "") -> str:
    """A number for a table: '-' for None, thousands separators, fixed digits."""
    if x is None:
        return "-"
    if isinstance(x, int):
        return f"{x:,}{unit}"
    return f"{x:,.{digits}f}{unit}"
