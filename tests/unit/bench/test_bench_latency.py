"""`krill bench latency`'s analysis on hand-made inputs with known answers: the version rate, requests per
commit in the commit window, the verifier's counts from a real state file, and the table of a profile whose
roles stopped. The demo runs themselves are in tests/integration/test_bench_protocol_runs.py."""

from __future__ import annotations

import pytest

from krill.bench.lag_proxy import LinkStats
from krill.bench.latency import markdown, requests_per_commit, verifier_counts, versions_per_minute
from krill.bench_env import machine_facts


def test_versions_per_minute_runs_from_the_first_to_the_last_version_published():
    assert versions_per_minute([(1, 100), (2, 101), (11, 130)]) == pytest.approx(20.0)
    assert versions_per_minute([(1, 100)]) is None
    assert versions_per_minute([(1, 100), (2, 100)]) is None  # one block second: no rate to read


def test_requests_per_commit_count_the_window_between_the_first_and_the_last_commit():
    stats = LinkStats(requests=[(99.5, "eth_chainId"),  # set-up, before the first commit
                                (100.2, "eth_call"), (100.7, "eth_sendRawTransaction"),
                                (103.9, "eth_call"), (104.5, "eth_call"),  # in the last commit's second
                                (105.1, "eth_call")])  # after
    out = requests_per_commit(stats, [104, 100, 102])
    assert out["commits"] == 2 and out["window_s"] == 5
    assert out["methods"] == {"eth_call": 1.5, "eth_sendRawTransaction": 0.5} and out["total"] == 2.0
    assert requests_per_commit(stats, [100])["total"] is None


def test_verifier_counts_read_every_state_file_by_status(tmp_path):
    from verifier.state import ATTESTED, MISSED, Job, VerifierState

    directory = tmp_path / "home" / "verifier" / "0xabc" / "state"
    state = VerifierState.for_run(directory, contract="0x" + "11" * 20, run_id=b"\x22" * 32, verifier="0x" + "33" * 20)
    jobs = [Job(i, "0x" + "44" * 20, 1, i, bytes([i]) * 32, 10 + i) for i in range(1, 6)]
    state.add_events(jobs, [], 20)
    state.finish(1, ATTESTED, ok=True)
    state.finish(2, ATTESTED, ok=False, reason="wrong_rewards")
    state.finish(3, MISSED)
    assert verifier_counts(tmp_path) == {"attested": 2, "missed": 1, "pending": 2, "skipped": 0, "error": 0}


def test_the_table_names_a_profile_whose_role_stopped_and_tallies_the_others():
    links = {"worker": LinkStats(stalls=2, resets=1).as_dict(), "verifier": LinkStats(resets=1).as_dict()}
    ok = {"profile": "100 ms", "link": "100 ± 20 ms one way", "stopped": None, "versions_per_min": 26.04,
          "accepted": 39, "rejected": 19, "rejected_by_reason": {"wrong_rewards": 19},
          "verifier": {"attested": 5, "missed": 0, "pending": 3}, "jailed": ["worker-2"], "links": links,
          "worker_requests_per_commit": {"total": 8.7, "methods": {"eth_call": 4.67}},
          "verifier_requests_per_commit": {"total": 1.5, "methods": {}}}
    stopped = {"profile": "harsh", "link": "150 ms", "stopped": "worker-0 stopped unexpectedly:\nTraceback ...",
               "links": links}
    text = markdown({"size": "default", "machine": machine_facts(), "loadavg_start": [0.1, 0.2, 0.3],
                     "loadavg_end": [0.4, 0.5, 0.6], "seconds": 600.0, "points": [ok, stopped],
                     "settings": {"workers": 3, "adversaries": 1, "verifiers": 1, "model": "tiny", "shards": 2,
                                  "minutes": 1.5}})
    assert "| 100 ± 20 ms one way | 26.0 | 39 | 19 (wrong_rewards 19) | 5 / 0 / 3 | 8.7 | 1.5 | 2 / 2 | " \
           "no (jailed: worker-2) |" in text
    assert "| 150 ms | - | - | - | - | - | - | 2 / 2 | worker-0 stopped unexpectedly: |" in text
    assert "| eth_call | 4.67 |" in text and "usable CPUs of" in text


def test_link_runs_one_profile_of_the_default_size_seeded_as_in_the_full_run(monkeypatch, tmp_path):
    """`--link 300` runs the 300 ms profile alone, with the seed it has in the full run (so runs before and
    after a change compare), and a name that is no profile is refused before anything runs."""
    from click.testing import CliRunner

    import krill.bench.latency as latency
    from krill.cli import cli
    from krill.errors import KrillError

    assert latency.profile_named("300") == latency.profile_named("300 ms") == "300 ms"
    with pytest.raises(ValueError, match="no link profile"):
        latency.profile_named("250")
    seeds = []

    def run_probed_demo(config, workdir, chain_link):
        seeds.append(chain_link.seed)
        raise KrillError("stopped here")

    monkeypatch.setattr(latency, "run_probed_demo", run_probed_demo)
    monkeypatch.setattr(latency, "model_dir", lambda size, root: root / "model")
    full = latency.run_latency("default", echo=lambda line: None)
    one = latency.run_latency("default", echo=lambda line: None, link="300")
    assert [p["profile"] for p in one["points"]] == ["300 ms"] and one["only"] == "300 ms"
    assert seeds[-1] == seeds[list(latency.PROFILES).index("300 ms")]
    assert len(full["points"]) == len(latency.PROFILES) and "only" not in full
    assert "300 ms only" in latency.markdown(one)
    result = CliRunner().invoke(cli, ["bench", "latency", "--link", "250", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "no link profile" in result.output
