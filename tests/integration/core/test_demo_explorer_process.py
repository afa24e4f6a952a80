"""The demo's explorer child (`krill.demo.explorer.start_explorer`) against a real `krill explorer` process:
on a busy port it is reported not started, with the explorer's one-line reason; on port 0 its real URL."""

from __future__ import annotations

import os
import socket

import httpx
import pytest
import tomli_w

from krill.demo.explorer import ExplorerNotServing, start_explorer
from krill.demo.processes import ProcessGroup
from krill.testing.index_world import fill_index_world


@pytest.mark.slow
def test_the_demo_reports_the_explorer_only_once_it_serves(tmp_path):
    world = fill_index_world(f"sqlite:///{tmp_path / 'krill.db'}", tmp_path)
    config = tmp_path / "explorer.toml"
    config.write_text(tomli_w.dumps({"database": {"url": world.url},
                                     "store": {"type": "local", "path": str(tmp_path / "store")}}))
    env = {**os.environ, "KRILL_HOME": str(tmp_path / "home")}
    env.pop("KRILL_CONFIG", None)
    with ProcessGroup(tmp_path / "logs", env) as procs, socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ExplorerNotServing) as refused:
            start_explorer(procs, config, world.url, port, tmp_path / "summary.json")
        assert str(refused.value) == (f"explorer did not start (exit 1): error: cannot listen on 127.0.0.1:{port}: "
                                      "Address already in use; choose another --port (0: any free one) or --host, "
                                      f"or stop what holds it (log {tmp_path / 'logs' / 'explorer.log'})")
        url = start_explorer(procs, config, world.url, 0, tmp_path / "summary.json")
        assert url.startswith("http://127.0.0.1:") and url != f"http://127.0.0.1:{port}/"
        assert httpx.get(url + "api/versions", timeout=30).json()["total"] == 3


@pytest.mark.slow
def test_the_demo_explorer_serves_before_the_coordinator_made_the_index(tmp_path):
    db_url = f"sqlite:///{tmp_path / 'krill.db'}"  # no file yet: the demo starts the explorer before the coordinator
    config = tmp_path / "explorer.toml"
    config.write_text(tomli_w.dumps({"database": {"url": db_url},
                                     "store": {"type": "local", "path": str(tmp_path / "store")}}))
    env = {**os.environ, "KRILL_HOME": str(tmp_path / "home")}
    env.pop("KRILL_CONFIG", None)
    with ProcessGroup(tmp_path / "logs", env) as procs:
        url = start_explorer(procs, config, db_url, 0, tmp_path / "summary.json")
        assert httpx.get(url + "api/runs", timeout=30).json()["total"] == 0  # empty until the coordinator indexes
        assert procs.children[0].running()
