"""A short run of the whole protocol shared by the tests that look at one (run once per session).

`short_demo` runs the demo's orchestrator on a tiny model: Anvil, the local store, SQLite, a
coordinator, three workers of which one forges its rewards, a verifier checking every commit,
one minute of training, an audit of every version and a release. The end-to-end test checks
the run itself and the explorer in a real browser walks its database; each ran a demo of its own
before (about 80 s each on 2 cores). The fixture only runs the demo: what a run must show is
asserted by the tests. It also reads two explorer pages while the demo's own explorer still serves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from krill.demo.orchestrate import DemoConfig, run_demo
from krill.model.build import TinyModelSpec, build_tiny_model


@dataclass
class ShortDemo:
    workdir: Path
    summary: dict
    lines: list[str] = field(default_factory=list)
    pages: dict[str, str] = field(default_factory=dict)  # explorer path -> body, read while the demo served it


@pytest.fixture(scope="session")
def short_demo(tmp_path_factory) -> ShortDemo:
    root = tmp_path_factory.mktemp("short-demo")
    model_dir = root / "tiny"
    build_tiny_model(seed=1, spec=TinyModelSpec(hidden=32, layers=2, heads=2, intermediate=64), directory=model_dir)
    config = DemoConfig(workers=3, adversaries=1, verifiers=1, minutes=1.0, versions=200, shards=2, eval_every=5,
                        model_dir=model_dir, release_eval_n=50, audit_last=1000,
                        spec_overrides={"chain": {"check_probability_ppm": 1_000_000, "attestation_quorum": 1},
                                        "version": {"contributions": 2, "deadline_s": 5.0}, "eval_n": 50})
    lines: list[str] = []
    pages: dict[str, str] = {}

    def fetch_explorer(summary: dict) -> None:  # the demo's explorer still serves the finished run here
        import urllib.request

        for path in ("", "api/participants"):
            with urllib.request.urlopen(summary["explorer"] + path, timeout=10) as response:
                pages[path] = response.read().decode()

    summary = run_demo(config, root / "demo", echo=lines.append, on_summary=fetch_explorer)
    return ShortDemo(root / "demo", summary, lines, pages)
