"""The Kubo RPC backend against a real HTTP server on loopback.

No Kubo daemon can be installed here and the embedded Kubo library serves no RPC API, so this
server implements the RPC endpoints Krill uses (same paths, POST only, multipart uploads, Kubo's
JSON answers and error shape) over a `LocalStore`. It checks Krill's side of the protocol: request
shapes, streaming with caps, error mapping, and that answers are verified rather than trusted.
"""

import dataclasses
import email.parser
import email.policy
import json
import random
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from krill.errors import ContentNotFoundError, IntegrityError, StoreError, StoreUnavailableError
from krill.store.base import ObjectTooLargeError
from krill.store.cid import CHUNK_SIZE, file_cid, normalize_cid, raw_block_cid
from krill.store.kubo import KuboStore
from krill.store.local import LocalStore
from krill.store.unixfs import build_file_dag


class KuboLikeHandler(BaseHTTPRequestHandler):
    store: LocalStore
    pins: set
    tamper = False
    refuse_cat: str | None = None  # Kubo's own error for a DAG `cat` cannot read
    seen: list

    def log_message(self, *args):
        pass

    def _reply(self, status, body, content_type="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, message, status=500):
        self._reply(status, json.dumps({"Message": message, "Code": 0, "Type": "error"}).encode())

    def _upload(self):
        length = int(self.headers["Content-Length"])
        raw = b"Content-Type: " + self.headers["Content-Type"].encode() + b"\r\n\r\n" + self.rfile.read(length)
        msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(raw)
        part = next(iter(msg.iter_parts()))
        assert part.get_filename(), "Kubo needs an explicit filename"
        return part.get_payload(decode=True)

    def do_GET(self):
        self._error("405 - Method Not Allowed", 405)

    def do_POST(self):
        url = urllib.parse.urlparse(self.path)
        params = dict(urllib.parse.parse_qsl(url.query))
        command = url.path.removeprefix("/api/v0/")
        self.seen.append((command, params))
        try:
            if command == "add":
                assert params["cid-version"] == "1" and params["raw-leaves"] == "true"
                cid = self.store.add(self._upload())
                self._reply(200, json.dumps({"Name": "blob", "Hash": cid, "Size": "0"}).encode() + b"\n")
            elif command == "block/put":
                assert params["cid-codec"] == "raw"
                data = self._upload()
                cid = self.store.put_block(data)
                self._reply(200, json.dumps({"Key": cid, "Size": len(data)}).encode())
            elif command in ("cat", "block/get"):
                if command == "cat" and self.refuse_cat:
                    return self._error(self.refuse_cat)
                if command == "cat":
                    data = self.store.get(params["arg"])
                    if "length" in params:
                        data = data[:int(params["length"])]
                else:  # one block's bytes, as stored (a dag-pb node is not its file's content)
                    data = self.store._read_block(params["arg"])
                if self.tamper:
                    data = data[:-1] + bytes([data[-1] ^ 1])
                self._reply(200, data, "text/plain")
            elif command == "block/stat":
                if not self.store.has(params["arg"]):
                    return self._error(f"block was not found locally (offline): ipld: could not find {params['arg']}")
                self._reply(200, json.dumps({"Key": params["arg"], "Size": 0}).encode())
            elif command == "pin/add":  # `arg` may repeat: several pins in one request
                args = urllib.parse.parse_qs(url.query)["arg"]
                missing = [a for a in args if not self.store.has(a)]
                if missing:
                    return self._error(f"pin: block was not found locally (offline): ipld: could not find {missing[0]}")
                self.pins.update(args)
                self._reply(200, json.dumps({"Pins": args}).encode())
            elif command == "pin/rm":
                if params["arg"] not in self.pins:
                    return self._error("not pinned or pinned indirectly")
                self.pins.discard(params["arg"])
                self._reply(200, json.dumps({"Pins": [params["arg"]]}).encode())
            else:
                self._error(f"unknown command {command}", 404)
        except ContentNotFoundError as exc:
            self._error(f"ipld: could not find node: {exc}")


@pytest.fixture
def kubo(tmp_path):
    handler = type("Handler", (KuboLikeHandler,), {"store": LocalStore(tmp_path), "pins": set(), "seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    store = KuboStore(f"http://127.0.0.1:{server.server_address[1]}", timeout_s=5, max_get_bytes=4 << 20)
    yield store, handler
    store.close()
    server.shutdown()
    server.server_close()


def test_round_trip_and_request_shape(kubo):
    store, handler = kubo
    data = random.Random(1).randbytes(2 * CHUNK_SIZE + 3)
    cid = store.add(data)
    assert cid == file_cid(data)
    assert store.get(cid) == data
    header = store.put_block(b"hello world\n")
    assert header == raw_block_cid(b"hello world\n")
    assert store.get(header) == b"hello world\n"
    assert store.has(cid) and not store.has(raw_block_cid(b"absent"))
    store.pin(cid)
    store.unpin(cid)
    store.unpin(cid)  # idempotent
    commands = [c for c, _ in handler.seen]
    assert commands[:4] == ["add", "cat", "block/put", "block/get"]
    assert all("timeout" in p for c, p in handler.seen if c in ("cat", "block/get"))


def test_prepared_content_is_added_when_put(kubo, monkeypatch):
    import krill.store.kubo as kubo_module

    store, handler = kubo
    data = random.Random(4).randbytes(2 * CHUNK_SIZE + 9)
    prepared = store.prepare(data)
    assert prepared.cid == file_cid(data) and handler.seen == []  # nothing sent yet
    hashed = []
    monkeypatch.setattr(kubo_module, "file_cid", lambda d: hashed.append(d) or file_cid(d))
    assert store.put_prepared(prepared, pin=True) == prepared.cid
    assert hashed == []  # the upload is checked against the CID prepare computed, not hashed again
    assert [c for c, _ in handler.seen] == ["add"]
    monkeypatch.undo()
    assert store.get(prepared.cid) == data
    # Kubo's answer is still checked: content prepared under another CID is refused.
    wrong = dataclasses.replace(store.prepare(b"other content"), cid=prepared.cid)
    with pytest.raises(IntegrityError, match="hashes to"):
        store.put_prepared(wrong)


def test_answers_are_verified(kubo):
    store, handler = kubo
    data = random.Random(2).randbytes(CHUNK_SIZE + 10)
    cid = store.add(data)
    block = store.put_block(b"abc")
    handler.tamper = True
    with pytest.raises(IntegrityError):
        store.get(cid)
    with pytest.raises(IntegrityError):
        store.get(block)


@pytest.mark.parametrize("size", [0, 12, 2 * CHUNK_SIZE + 5])
def test_cid_v0_content_from_plain_ipfs_add_is_read_and_verified(kubo, size):
    """A CIDv0 DAG (dag-pb leaves) does not rebuild as Krill's CIDv1 raw-leaves DAG from its bytes;
    it is walked block by block instead, each block checked against its CID."""
    store, handler = kubo
    data = random.Random(size).randbytes(size)
    blocks = list(build_file_dag(data, cid_version=0))  # what plain `ipfs add` stores
    for cid, block in blocks:
        handler.store._write_block(cid, block)
    root = blocks[-1][0]
    assert root.startswith("Qm")
    assert store.get(root) == data
    walked = [p["arg"] for c, p in handler.seen if c == "block/get"]
    assert len(walked) == len(blocks) and set(walked) == {normalize_cid(c) for c, _ in blocks}
    if size:
        handler.tamper = True
        with pytest.raises(IntegrityError, match="does not hash to"):
            store.get(root)
        handler.tamper = False
        with pytest.raises(ObjectTooLargeError):
            store.get(root, max_bytes=size - 1)


def test_a_dag_kubo_refuses_to_cat_is_the_signers_fault_not_the_stores(kubo):
    """A worker names a UnixFS directory where a file belongs: Kubo's `cat` answers HTTP 500. That was a
    plain StoreError, which reads as this node's own failure; the block walk names the blocks' fault."""
    from krill.store.cid import dag_pb_cid
    from krill.store.unixfs import MalformedBlockError, encode_dag_pb, encode_unixfs

    store, handler = kubo
    directory = encode_dag_pb([], encode_unixfs(1, None, 0, []))  # UnixFS type 1: a directory
    cid = dag_pb_cid(directory)
    handler.store._write_block(cid, directory)
    handler.refuse_cat = "this dag node is a directory"
    with pytest.raises(MalformedBlockError, match="not a file"):
        store.get(cid)
    assert [c for c, _ in handler.seen] == ["cat", "block/get"]


def test_caps_and_errors(kubo):
    store, _ = kubo
    cid = store.add(bytes(5 << 20))
    with pytest.raises(ObjectTooLargeError):
        store.get(cid)
    with pytest.raises(ContentNotFoundError):
        store.get(raw_block_cid(b"nobody has this"))
    with pytest.raises(StoreError):
        store.put_block(bytes((1 << 20) + 1))


def test_unreachable_daemon():
    store = KuboStore("http://127.0.0.1:9", timeout_s=2)
    with pytest.raises(StoreUnavailableError, match="is the daemon running"):
        store.put_block(b"x")


def test_pin_all_pins_several_in_one_request(kubo):
    store, handler = kubo
    cids = [store.add(random.Random(i).randbytes(100 + i)) for i in range(3)]
    handler.seen.clear()
    store.pin_all(cids)
    assert handler.pins == set(cids)
    assert [c for c, _ in handler.seen] == ["pin/add"]
    with pytest.raises(ContentNotFoundError):
        store.pin_all([raw_block_cid(b"absent")])
