"""`krill devnet up` writes a config of its own chain on the defaults: an operator's KRILL_CONFIG (its keystore
password, its production database) used to be copied into it, and a bad KRILL_CONFIG left Anvil running."""

from __future__ import annotations

import os

import pytest

from krill.chain.anvil import free_port, pid_alive
from krill.chain.devnet import read_state, start_devnet, stop_devnet
from krill.config import load_config


def test_devnet_up_ignores_the_operators_config(tmp_path, monkeypatch):
    user = tmp_path / "user.toml"
    user.write_text('[keystore]\npassword = "hunter2-secret"\npath = "/home/op/keys/w.json"\n'
                    '[database]\nurl = "postgresql+psycopg://op:dbpass@db.internal/krill"\n')
    monkeypatch.setenv("KRILL_CONFIG", str(user))
    state, started = start_devnet(tmp_path / "devnet", port=free_port())
    try:
        assert started
        written = (tmp_path / "devnet" / "config.toml").read_text()
        for leaked in ("hunter2", "dbpass", "db.internal", "/home/op"):
            assert leaked not in written, written
        config = load_config(tmp_path / "devnet" / "config.toml", environ={})
        assert (config.chain.protocol_address, config.chain.deploy_block) == (state.protocol_address,
                                                                              state.deploy_block)
        assert ((tmp_path / "devnet" / "config.toml").stat().st_mode & 0o777) == 0o600
    finally:
        stop_devnet(tmp_path / "devnet")
    assert not pid_alive(state.pid) and read_state(tmp_path / "devnet") is None


def test_a_failure_after_anvil_started_stops_it(tmp_path, monkeypatch):
    import krill.chain.devnet as devnet

    started = []
    real_start = devnet.AnvilProcess.start

    def remember(*args, **kwargs):
        started.append(real_start(*args, **kwargs))
        return started[-1]

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(devnet.AnvilProcess, "start", remember)
    monkeypatch.setattr(devnet, "write_config", broken, raising=False)
    monkeypatch.setattr("krill.config.write_config", broken)
    with pytest.raises(OSError, match="disk full"):
        start_devnet(tmp_path / "devnet", port=free_port())
    assert started and not pid_alive(started[0].pid)
    assert read_state(tmp_path / "devnet") is None


def test_devnet_ups_started_at_once_share_one_devnet(tmp_path):
    """Before: each found no devnet and started its own Anvil on the port; all but one failed, told the port served
    'a chain not started by Krill' (the first's, mid-start), that their Anvil had exited, or 'nonce too low' (two
    deploying on the first's Anvil, each taking it for its own). Now they take turns:
    one starts the devnet and the others find it running."""
    import threading

    state_dir, port = tmp_path / "devnet", free_port()
    start, results = threading.Barrier(3), []

    def up():
        start.wait()
        try:
            results.append(start_devnet(state_dir, port=port))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            results.append(exc)

    threads = [threading.Thread(target=up) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert all(isinstance(r, tuple) for r in results), results
        assert sorted(started for _, started in results) == [False, False, True]
        assert {state for state, _ in results} == {read_state(state_dir)}
    finally:
        stop_devnet(state_dir)


@pytest.mark.parametrize("proc", ["/proc", "/no-proc-here"], ids=["linux", "no-proc"])
def test_devnet_down_stops_its_anvil_with_or_without_proc(tmp_path, monkeypatch, proc):
    """Before: without /proc (macOS), `krill devnet down` refused every devnet as 'no longer Anvil'."""
    from pathlib import Path

    import krill.chain.devnet as devnet

    state, started = start_devnet(tmp_path / "devnet", port=free_port())
    assert started
    try:
        monkeypatch.setattr(devnet, "PROC", Path(proc))
        assert stop_devnet(tmp_path / "devnet")
    finally:
        if pid_alive(state.pid):
            from krill.chain.anvil import stop_pid

            stop_pid(state.pid)
    assert not pid_alive(state.pid) and read_state(tmp_path / "devnet") is None
    assert not devnet._is_anvil(os.getpid())  # this test's own process is no Anvil, by either reading
