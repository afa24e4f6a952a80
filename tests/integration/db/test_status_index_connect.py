"""Status opens a PostgreSQL index with a bounded connect (`krill.account_status.open_index`): every
`krill worker status` / `krill verifier status` opens the configured index first, and libpq without a
`connect_timeout` waits for a server's answer for ever."""

from __future__ import annotations

import socket
import threading
import time

from krill.account_status import open_index
from krill.config import KrillConfig

PROTOCOL = "0x" + "44" * 20  # the hand-filled index's contract


def _config(url: str) -> KrillConfig:
    return KrillConfig.model_validate({"database": {"url": url}, "chain": {"protocol_address": PROTOCOL}})


def test_a_postgresql_server_that_never_answers_costs_seconds_not_a_hang():
    """Before: still waiting when the test gave up on it (40 s in the repro, and for good: nothing bounds it)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held = []
    threading.Thread(target=lambda: [held.append(listener.accept()) for _ in range(8)], daemon=True).start()
    got: dict = {}
    url = f"postgresql+psycopg://krill@127.0.0.1:{listener.getsockname()[1]}/krill"
    opening = threading.Thread(target=lambda: got.setdefault("index", open_index(_config(url))), daemon=True)
    started = time.monotonic()
    try:
        opening.start()
        opening.join(30)
        assert not opening.is_alive(), "status still waiting for the index after 30 s"
        assert time.monotonic() - started < 20
        index = got["index"]
        assert index.db is None and index.note.startswith("unknown (index unreadable: ")
        assert "timeout" in index.note
    finally:
        for conn, _ in held:
            conn.close()
        listener.close()


def test_a_reachable_postgresql_index_still_opens_and_a_url_timeout_is_kept(postgres_url, tmp_path):
    from krill.testing.index_world import fill_index_world
    from krill.testing.postgres import create_database

    url = create_database(postgres_url, "krill_status_index")
    fill_index_world(url, tmp_path)
    for target in (url, url + ("&" if "?" in url else "?") + "connect_timeout=2"):
        index = open_index(_config(target))
        try:
            assert (index.note, index.next_block) == ("index", 100)
            assert index.db.engine.url.query["connect_timeout"] == ("2" if target != url else "5")
        finally:
            index.close()
