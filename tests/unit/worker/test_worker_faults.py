"""What the worker does when the chain or the store answers badly, against in-process fakes: a contribution
the chain will never take (front-run digest, reused nonce) is logged and dropped instead of stopping every
restart; store errors that only mean "not yet" are waited out; a published version that does not decode is
skipped for the newest one before it that loads."""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace

import pytest

from krill.chain import errors as E
from krill.errors import ContentNotFoundError, IntegrityError, ModelError, PayloadError, StoreError
from krill.store.cid import file_cid, raw_block_cid
from krill.store.unixfs import ObjectTooLargeError
from krill.worker.backoff import Backoff
from krill.worker.contribute import COMMITTED, FRONT_RUN, NONCE_REUSED, STALE, Contributor
from krill.worker.errors import BrokenVersionError
from krill.worker.nonce_state import Pending, WorkerState
from krill.worker.source import RunSource

RUN = hashlib.sha256(b"run").digest()
ME = "0x" + "aa" * 20
THIEF = "0x" + "bb" * 20
FILES = {"rollouts.safetensors": b"rollouts", "grad-0.safetensors": b"gradient"}


class FakeChain:
    """Commits by digest (with the (version, nonce) of each id in `keys`, all in run RUN), a `commit` that
    raises what the test scripts, and a block number that moves on each time it is read."""

    def __init__(self):
        self.by_digest: dict[bytes, tuple[int, str]] = {}
        self.keys: dict[int, tuple[int, int]] = {}
        self.commit_raises: Exception | None = None
        self.commits: list[tuple] = []
        self.block = 0

    def commit_id_by_digest(self, digest: bytes) -> int:
        return self.by_digest.get(digest, (0, ""))[0]

    def commit_of(self, commit_id: int):
        """The commit, or the contract's zero struct (worker = zero address) for an id not mined."""
        found = [(d, w) for d, (i, w) in self.by_digest.items() if i == commit_id]
        if not found:
            return SimpleNamespace(run_id=bytes(32), worker="0x" + "00" * 20, version=0, nonce=0,
                                   header_digest=bytes(32))
        version, nonce = self.keys.get(commit_id, (None, None))  # None: a test that did not say
        return SimpleNamespace(run_id=RUN, worker=found[0][1], version=version, nonce=nonce, header_digest=found[0][0])

    def commit(self, run_id, version, nonce, digest):
        if self.commit_raises is not None:
            raise self.commit_raises
        commit_id = len(self.commits) + 100
        self.commits.append((version, nonce, digest))
        self.by_digest[digest] = (commit_id, ME)
        self.keys[commit_id] = (version, nonce)
        return SimpleNamespace(event=lambda kind: SimpleNamespace(commit_id=commit_id))

    def block_number(self) -> int:
        self.block += 1
        return self.block


class FakeStore:
    """Content-addressed adds and blocks; `failures` are raised first, one per call."""

    def __init__(self, failures=()):
        self.failures = list(failures)
        self.added: list[bytes] = []

    def _maybe_fail(self):
        if self.failures:
            raise self.failures.pop(0)

    def add(self, data: bytes, pin: bool = False) -> str:
        self._maybe_fail()
        self.added.append(data)
        return file_cid(data)

    def put_block(self, data: bytes, pin: bool = False) -> str:
        self._maybe_fail()
        self.added.append(data)
        return raw_block_cid(data)


def _header(nonce: int) -> bytes:
    refs = {name: {"cid": file_cid(data)} for name, data in FILES.items()}
    return json.dumps({"nonce": nonce, "files": refs}, sort_keys=True).encode()


def _contributor(tmp_path, chain=None, store=None, uploads=False, lines=None):
    state = WorkerState.open(tmp_path, RUN, ME)
    backoff = Backoff(0.01, 0.02, echo=(lines if lines is not None else []).append, sleep=lambda s: None)
    spec = SimpleNamespace(run_id=RUN, staleness=SimpleNamespace(max_staleness=2))
    return Contributor(chain or FakeChain(), store or FakeStore(), spec, source=None,
                       who=SimpleNamespace(worker=ME), behavior=SimpleNamespace(uploads=uploads), shards=[0],
                       state=state, backoff=backoff, echo=(lines if lines is not None else []).append)


def _save(contributor: Contributor, nonce: int | None = None) -> tuple[Pending, bytes]:
    nonce = contributor.state.reserve_nonce() if nonce is None else nonce
    header = _header(nonce)
    pending = Pending(model_version=3, behaviour_version=3, nonce=nonce, digest=hashlib.sha256(header).hexdigest(),
                      files=sorted(FILES))
    contributor.state.save_pending(pending, header, dict(FILES))
    return pending, header


def test_a_front_run_digest_found_on_resume_is_logged_dropped_and_the_worker_goes_on(tmp_path):
    chain = FakeChain()
    first = _contributor(tmp_path, chain)
    pending, header = _save(first)
    chain.by_digest[hashlib.sha256(header).digest()] = (41, THIEF)  # someone copied it from the mempool
    # The process stops here; every restart used to stop again on the same pending contribution.
    again = _contributor(tmp_path, chain)
    outcome = again.resume()
    assert outcome.status == FRONT_RUN and outcome.commit_id is None and outcome.resumed
    assert pending.digest in outcome.detail and THIEF in outcome.detail and "#41" in outcome.detail
    assert THIEF in outcome.line() and "FRONT-RUN" in outcome.line()
    assert again.state.pending is None and again.state.history()[-1]["status"] == FRONT_RUN
    assert not list((again.state.directory / "pending").iterdir())
    third = _contributor(tmp_path, chain)
    assert third.resume() is None and third.state.reserve_nonce() == pending.nonce + 1  # a fresh nonce


def test_a_commit_reverted_because_another_account_took_the_digest_is_dropped(tmp_path):
    chain = FakeChain()
    contributor = _contributor(tmp_path, chain, uploads=True)
    pending, header = _save(contributor)
    digest = hashlib.sha256(header).digest()
    chain.by_digest[digest] = (41, THIEF)
    chain.commit_raises = E.CommitDigestTaken("CommitDigestTaken", (digest, 41))
    outcome = contributor.submit(pending, header, dict(FILES), {}, 0.0, resumed=False)
    assert (outcome.status, outcome.nonce) == (FRONT_RUN, pending.nonce) and THIEF in outcome.detail
    assert outcome.bytes_uploaded > 0 and contributor.state.pending is None
    chain.commit_raises = None
    following, header2 = _save(contributor)
    assert following.nonce == pending.nonce + 1
    assert contributor.submit(following, header2, dict(FILES), {}, 0.0, resumed=False).status == COMMITTED


def test_a_nonce_already_committed_under_another_digest_is_dropped_not_fatal(tmp_path):
    chain = FakeChain()
    contributor = _contributor(tmp_path, chain)
    pending, header = _save(contributor)
    chain.by_digest[hashlib.sha256(b"another header").digest()] = (7, ME)  # an earlier life's commit of the nonce
    chain.keys[7] = (3, pending.nonce)
    chain.commit_raises = E.CommitDuplicate("CommitDuplicate", (RUN, ME, 3, pending.nonce, 7))
    outcome = contributor.submit(pending, header, dict(FILES), {}, 0.0, resumed=False)
    assert outcome.status == NONCE_REUSED and f"nonce {pending.nonce}" in outcome.detail
    assert contributor.state.pending is None and contributor.state.history()[-1]["status"] == NONCE_REUSED
    assert contributor.state.reserve_nonce() == pending.nonce + 1


def test_a_duplicate_revert_of_our_own_landed_commit_still_counts_as_committed(tmp_path):
    chain = FakeChain()
    contributor = _contributor(tmp_path, chain)
    pending, header = _save(contributor)
    chain.by_digest[hashlib.sha256(header).digest()] = (9, ME.upper().replace("0X", "0x"))  # the lost receipt's
    chain.commit_raises = E.CommitDuplicate("CommitDuplicate", (RUN, ME, 3, pending.nonce, 9))
    outcome = contributor.submit(pending, header, dict(FILES), {}, 0.0, resumed=False)
    assert (outcome.status, outcome.commit_id) == (COMMITTED, 9)


@pytest.mark.parametrize("at_named_id", ["another worker's commit", "our commit of another nonce", "nothing mined",
                                         "ours, landed under the next id"])
def test_a_duplicate_revert_naming_an_id_that_is_not_our_commit_waits_for_ours_instead_of_logging_it_lost(
        tmp_path, at_named_id):
    """The estimate ran against the pending block, where our own transaction sat: the id the revert names (7)
    is only the one it would get. At the latest block 7 holds whatever landed there; ours lands as 8."""
    chain = FakeChain()
    lines: list[str] = []
    contributor = _contributor(tmp_path, chain, lines=lines)
    earlier, _ = _save(contributor)
    contributor.state.finish({"status": COMMITTED, "nonce": earlier.nonce})
    pending, header = _save(contributor)
    ours = hashlib.sha256(header).digest()
    if at_named_id == "another worker's commit":  # same version and nonce, in its own key
        chain.by_digest[hashlib.sha256(b"their header").digest()] = (7, THIEF)
        chain.keys[7] = (3, pending.nonce)
    elif at_named_id == "our commit of another nonce":
        chain.by_digest[hashlib.sha256(b"our earlier header").digest()] = (7, ME)
        chain.keys[7] = (3, earlier.nonce)

    def land_ours() -> None:
        chain.by_digest[ours], chain.keys[8] = (8, ME), (3, pending.nonce)
        chain.commit_raises = E.CommitDuplicate("CommitDuplicate", (RUN, ME, 3, pending.nonce, 8))

    if at_named_id == "ours, landed under the next id":
        chain.by_digest[hashlib.sha256(b"their header").digest()] = (7, THIEF)
        chain.keys[7] = (3, 0)
        land_ours()
    else:  # still in the pool; it lands with the next block
        block_number = chain.block_number
        chain.block_number = lambda: (block_number(), chain.block == 2 and land_ours())[0]
    chain.commit_raises = E.CommitDuplicate("CommitDuplicate", (RUN, ME, 3, pending.nonce, 7))
    outcome = contributor.submit(pending, header, dict(FILES), {}, 0.0, resumed=False)
    assert (outcome.status, outcome.commit_id) == (COMMITTED, 8), outcome.detail
    waited = any("waiting for the next block" in line for line in lines)
    assert waited == (at_named_id != "ours, landed under the next id")
    assert [h["status"] for h in contributor.state.history()] == [COMMITTED, COMMITTED]  # no nonce-reused line
    assert contributor.state.pending is None


def _failed_on_chain(chain: FakeChain, latest: int, max_staleness: int = 2) -> None:
    """The next commit is mined and fails with no replay that reverts (`TransactionFailed`); the run stands
    at `latest` and the worker's stake is fine."""
    from krill.chain.tx import TransactionFailed

    chain.commit_raises = TransactionFailed("commit: transaction 0xab failed on chain (status 0)", "0xab", 12)
    chain.run_of = lambda run_id: SimpleNamespace(latest_version=latest,
                                                  params=SimpleNamespace(max_staleness=max_staleness))
    chain.stake_of = lambda who: SimpleNamespace(jailed=False)
    chain.is_eligible = lambda who, role: True


def test_a_commit_mined_after_a_front_runners_copy_is_logged_front_run_and_the_worker_goes_on(tmp_path):
    chain = FakeChain()
    contributor = _contributor(tmp_path, chain)
    pending, header = _save(contributor)
    _failed_on_chain(chain, latest=3)
    chain.by_digest[hashlib.sha256(header).digest()] = (41, THIEF)  # landed in our block, ahead of us
    outcome = contributor.submit(pending, header, dict(FILES), {}, 0.0, resumed=False)
    assert (outcome.status, outcome.nonce) == (FRONT_RUN, pending.nonce) and THIEF in outcome.detail
    assert contributor.state.pending is None and contributor.state.history()[-1]["status"] == FRONT_RUN
    chain.commit_raises = None
    following, header2 = _save(contributor)
    assert contributor.submit(following, header2, dict(FILES), {}, 0.0, resumed=False).status == COMMITTED


def test_a_commit_mined_after_a_version_that_made_it_stale_is_logged_stale(tmp_path):
    chain = FakeChain()
    contributor = _contributor(tmp_path, chain)
    pending, header = _save(contributor)  # at version 3
    _failed_on_chain(chain, latest=6)  # 3 + S_max=2 < 6
    outcome = contributor.submit(pending, header, dict(FILES), {}, 0.0, resumed=False)
    assert outcome.status == STALE and "behind version 6" in outcome.detail
    assert contributor.state.pending is None and contributor.state.history()[-1]["status"] == STALE


def test_a_mined_failure_nothing_explains_is_committed_again_once(tmp_path):
    from krill.chain.tx import TransactionFailed

    chain = FakeChain()
    lines: list[str] = []
    contributor = _contributor(tmp_path, chain, lines=lines)
    pending, header = _save(contributor)
    _failed_on_chain(chain, latest=3)
    commit = FakeChain.commit.__get__(chain)
    failures = [chain.commit_raises]
    chain.commit_raises = None
    chain.commit = lambda *args: commit(*args) if not failures else (_ for _ in ()).throw(failures.pop())
    outcome = contributor.submit(pending, header, dict(FILES), {}, 0.0, resumed=False)
    assert outcome.status == COMMITTED and len(chain.commits) == 1
    assert any("committing again" in line for line in lines)
    second, header2 = _save(contributor)
    _failed_on_chain(chain, latest=3)
    with pytest.raises(TransactionFailed):  # twice: the worker stops, the contribution stays pending
        contributor.submit(second, header2, dict(FILES), {}, 0.0, resumed=False)
    assert contributor.state.pending == second


def test_an_upload_the_store_fails_for_now_is_retried_and_a_misnamed_one_stops(tmp_path):
    lines: list[str] = []
    store = FakeStore([ContentNotFoundError("Kubo at http://x did not answer add within 60.0s"),
                       StoreError("Kubo block/put failed with HTTP 502: bad gateway")])
    contributor = _contributor(tmp_path, store=store, uploads=True, lines=lines)
    pending, header = _save(contributor)
    outcome = contributor.submit(pending, header, dict(FILES), {}, 0.0, resumed=False)
    assert outcome.status == COMMITTED and contributor.backoff.waits == 2
    assert any("not available yet (StoreError: Kubo block/put failed with HTTP 502" in line for line in lines)
    store.failures = [IntegrityError("Kubo stored the content as bafyX but it hashes to bafyY")]
    second, header2 = _save(contributor)
    with pytest.raises(IntegrityError):
        contributor.submit(second, header2, dict(FILES), {}, 0.0, resumed=False)
    assert contributor.state.pending == second  # kept for the next start


def test_fetch_and_upload_retry_store_errors_but_not_those_that_would_fail_again():
    backoff = Backoff(0.01, 0.02, echo=lambda line: None, sleep=lambda s: None)

    def failing(*errors):
        errors = list(errors)

        def fn():
            if errors:
                raise errors.pop(0)
            return "ok"
        return fn

    assert backoff.fetch(failing(ContentNotFoundError("Kubo found no bafy within 60.0s"),
                                 IntegrityError("a broken stream"), StoreError("HTTP 500")), "version 4") == "ok"
    assert backoff.waits == 3
    with pytest.raises(ObjectTooLargeError):
        backoff.fetch(failing(ObjectTooLargeError("over the cap")), "version 4")
    with pytest.raises(ModelError):  # an answer, never retried
        backoff.fetch(failing(ModelError("shard 1: not a valid safetensors file")), "version 4")
    with pytest.raises(IntegrityError):
        backoff.upload(failing(IntegrityError("misnamed")), "store (upload)")
    with pytest.raises(ContentNotFoundError):  # a plain call retries only unreachability
        backoff.call(failing(ContentNotFoundError("missing")), "chain")
    assert backoff.waits == 3


class Loaded:
    def __init__(self, v):
        self.v = v

    def all_tensors(self):
        return {}

    def masks(self):
        return {}


def _source(monkeypatch, answers: dict, lines: list[str]) -> tuple[RunSource, list[int]]:
    """A RunSource whose version v loads as `answers[v]` says: a list of exceptions raised one per fetch, then
    the version."""
    import krill.protocol.state as state_module

    calls: list[int] = []

    def load(chain, store, spec, v):
        calls.append(v)
        pending = answers.get(v, [])
        if pending:
            raise pending.pop(0)
        return Loaded(v)

    monkeypatch.setattr(state_module, "load_chain_version", load)
    return RunSource(chain=None, store=None, spec=None, keep=8, echo=lines.append), calls


def test_a_version_that_does_not_decode_is_remembered_logged_once_and_refused_without_a_fetch(monkeypatch):
    lines: list[str] = []
    source, calls = _source(monkeypatch, {5: [PayloadError("not UTF-8 JSON", field="manifest")],
                                          6: [ContentNotFoundError("Kubo found no bafy within 60.0s")]}, lines)
    with pytest.raises(BrokenVersionError, match="version 5 is broken"):
        source.version(5)
    with pytest.raises(BrokenVersionError):
        source.version(5)
    assert calls == [5] and source.is_broken(5)
    assert len(lines) == 1 and "version 5 is broken and skipped" in lines[0] and "manifest" in lines[0]
    with pytest.raises(ContentNotFoundError):  # not there yet: not broken, fetched again next time
        source.version(6)
    assert source.version(6).v == 6 and not source.is_broken(6)


def test_the_contribution_loads_the_newest_version_that_decodes_and_waits_for_content(monkeypatch, tmp_path):
    lines: list[str] = []
    source, calls = _source(monkeypatch, {7: [ModelError("shard 1: not a valid safetensors file")],
                                          6: [ContentNotFoundError("Kubo found no bafy within 60.0s")]}, lines)
    contributor = _contributor(tmp_path, lines=lines)
    contributor.source = source
    version, state = contributor._loadable(7, source.version, "behaviour", 5)
    assert (version, state.v) == (6, 6) and calls == [7, 6, 6]  # 7 skipped, 6 waited for
    assert contributor.backoff.waits == 1
    assert contributor._loadable(7, source.version, "learner", 6)[0] == 6 and calls == [7, 6, 6]  # cached
    with pytest.raises(BrokenVersionError, match="no version in 7..7"):
        contributor._loadable(7, source.version, "learner", 7)


def test_a_worker_whose_newest_version_is_broken_samples_and_learns_at_the_one_before(monkeypatch, tmp_path):
    """`make` end to end with the model work faked: version 7 does not decode, so the contribution is made at
    version 6 instead of ending the worker; the log names version 7 once."""
    import torch

    import krill.protocol.work as work_module
    from krill.worker.behaviors import Behavior

    lines: list[str] = []
    source, calls = _source(monkeypatch, {7: [ModelError("shard 1: not a valid safetensors file")]}, lines)
    source.chain = SimpleNamespace(run_of=lambda run_id: SimpleNamespace(latest_version=7))
    source.spec = SimpleNamespace(run_id=RUN)
    source._tokenizer, source._task = SimpleNamespace(pad_token_id=0), object()
    contributor = _contributor(tmp_path, lines=lines)
    contributor.source = source
    contributor.spec.staleness.max_staleness = 2
    contributor.behaviour = SimpleNamespace(at=lambda v: ("engine", source.version(v)))
    contributor.learner = SimpleNamespace(at=lambda v: ("model", source.version(v)))
    rollouts = SimpleNamespace(num_completion_tokens=12)
    behavior = Behavior()
    monkeypatch.setattr(behavior, "sample", lambda work: SimpleNamespace(
        rewards=torch.tensor([1.0, 0.0]), seconds=0.1, rollouts=rollouts, sampled_at=work.engine[1].v))
    monkeypatch.setattr(work_module, "learn", lambda spec, model, state, sampled, shards, pad: SimpleNamespace(
        values={0: {}}, seconds=0.2, learner_version=state.v))
    contributor.behavior = behavior
    made = contributor.make()
    assert (made.behaviour_version, made.model_version, made.sampled.sampled_at) == (6, 6, 6)
    assert made.learned.learner_version == 6 and calls == [7, 6]  # 7 fetched once, then refused at once
    assert sum("version 7 is broken and skipped" in line for line in lines) == 1


def test_a_newest_version_read_after_sampling_below_the_behaviour_version_learns_at_the_behaviour_version(
        monkeypatch, tmp_path):
    """The chain says 7 before sampling and 6 after (a reorganisation took 7's publication back, or a lagging
    RPC node answered): the gradient is taken at 7, where the rollouts were sampled, instead of `make` looking
    for a loadable version in 7..6, finding none and stopping the worker with "each is broken"."""
    import torch

    import krill.protocol.work as work_module
    from krill.worker.behaviors import Behavior

    lines: list[str] = []
    source, calls = _source(monkeypatch, {}, lines)
    readings = iter([7, 6])
    source.chain = SimpleNamespace(run_of=lambda run_id: SimpleNamespace(latest_version=next(readings)))
    source.spec = SimpleNamespace(run_id=RUN)
    source._tokenizer, source._task = SimpleNamespace(pad_token_id=0), object()
    contributor = _contributor(tmp_path, lines=lines)
    contributor.source = source
    contributor.behaviour = SimpleNamespace(at=lambda v: ("engine", source.version(v)))
    contributor.learner = SimpleNamespace(at=lambda v: ("model", source.version(v)))
    behavior = Behavior()
    monkeypatch.setattr(behavior, "sample", lambda work: SimpleNamespace(
        rewards=torch.tensor([1.0, 0.0]), seconds=0.1, rollouts=SimpleNamespace(num_completion_tokens=12)))
    monkeypatch.setattr(work_module, "learn", lambda spec, model, state, sampled, shards, pad: SimpleNamespace(
        values={0: {}}, seconds=0.2, learner_version=state.v))
    contributor.behavior = behavior
    made = contributor.make()
    assert (made.behaviour_version, made.model_version, made.learned.learner_version) == (7, 7, 7)
    assert calls == [7] and not source.broken and not any("broken" in line for line in lines)


def test_a_contribution_that_does_not_encode_is_logged_and_dropped_not_fatal_in_the_background(tmp_path):
    """A gradient the run's codec cannot encode (here: over fp16's range, as a version with finite but huge
    weights gives) stopped the worker from its submission thread, and each restart made the same contribution
    (same nonce, same version) and stopped again; it is now logged, its nonce kept as used, and the loop goes
    on."""
    import time

    from krill.payload.errors import NonFiniteError
    from krill.worker.contribute import Made
    from krill.worker.pipeline import SubmitPipeline

    def sign(work, sampled, learned):
        raise NonFiniteError("value overflows fp16; clip before encoding", field="grad-0.lm_head.weight")

    contributor = _contributor(tmp_path)
    contributor.behavior = SimpleNamespace(uploads=False, sign=sign)
    nonce = contributor.state.reserve_nonce()
    made = Made(work=None, sampled=None, learned=None, nonce=nonce, behaviour_version=3, model_version=3,
                summary={"mean_reward": 0.5, "true_mean_reward": 0.5, "tokens": 9}, seconds={"sample": 0.1},
                started=time.perf_counter())
    pipeline = SubmitPipeline(contributor)
    pipeline.start(made, {})
    outcome = pipeline.wait()
    pipeline.close()
    assert outcome.status == "unencodable" and outcome.nonce == nonce and "overflows fp16" in outcome.detail
    assert contributor.state.pending is None and not contributor.chain.commits
    reopened = WorkerState.open(tmp_path, RUN, ME)  # as after a restart: the nonce is not made again
    assert reopened.next_nonce == nonce + 1
    assert [(h["nonce"], h["status"]) for h in reopened.history()] == [(nonce, "unencodable")]


def test_an_unreachable_chain_while_a_mined_failure_is_classified_is_waited_out_not_fatal(tmp_path):
    """The stake reads that classify a failed commit sit out an RPC outage like every other chain read: the
    worker commits again instead of stopping with `ChainUnavailableError`."""
    from krill.errors import ChainUnavailableError

    chain = FakeChain()
    contributor = _contributor(tmp_path, chain)
    pending, header = _save(contributor)
    _failed_on_chain(chain, latest=3)
    outages = [ChainUnavailableError("connection refused")]

    def stake_of(who):
        if outages:
            raise outages.pop()
        return SimpleNamespace(jailed=False)

    chain.stake_of = stake_of
    commit = FakeChain.commit.__get__(chain)
    failures = [chain.commit_raises]
    chain.commit_raises = None
    chain.commit = lambda *args: commit(*args) if not failures else (_ for _ in ()).throw(failures.pop())
    outcome = contributor.submit(pending, header, dict(FILES), {}, 0.0, resumed=False)
    assert outcome.status == COMMITTED and len(chain.commits) == 1 and not outages
    assert contributor.backoff.waits == 1


def test_a_version_the_chain_read_finds_unpublished_is_skipped_this_time_not_marked_broken(monkeypatch, tmp_path):
    """latestVersion said 8, but the read of version 8's digests answered "not published" (a node behind the
    first, or a reorganisation): the contribution works at 7 this time, and 8 is asked for again next time
    instead of being refused as broken for the rest of the process."""
    import krill.protocol.state as state_module

    monkeypatch.setattr(state_module, "load_version", lambda store, spec, v, manifest, record, *rest: Loaded(v))
    unpublished = {8: 1}  # version 8 reads as unpublished once

    def version_of(run_id, v):
        behind = unpublished.get(v, 0) > 0
        unpublished[v] = unpublished.get(v, 0) - 1
        return SimpleNamespace(manifest_digest=bytes(32) if behind else b"\x01" * 32, record_digest=b"\x02" * 32)

    lines: list[str] = []
    source = RunSource(SimpleNamespace(version_of=version_of), store=None, spec=SimpleNamespace(run_id=RUN), keep=8,
                       echo=lines.append)
    contributor = _contributor(tmp_path, lines=lines)
    contributor.source = source
    version, state = contributor._loadable(8, source.version, "behaviour", 6)
    assert (version, state.v) == (7, 7) and not source.is_broken(8) and not source.broken
    assert any("version 8 is not published" in line for line in lines)
    version, state = contributor._loadable(8, source.version, "learner", 7)
    assert (version, state.v) == (8, 8)


def _tiny_engine(version: int, norm_scale: float | None = None):
    """An HFEngine on a tiny seeded Llama; `norm_scale`: the final norm's weights scaled to that magnitude
    (finite, but the logits overflow)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from krill.rl.engine import HFEngine

    cfg = LlamaConfig(vocab_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, intermediate_size=64, max_position_embeddings=64,
                      eos_token_id=1, pad_token_id=0, bos_token_id=2, tie_word_embeddings=False)
    torch.manual_seed(3)
    model = LlamaForCausalLM(cfg).eval()
    if norm_scale is not None:
        with torch.no_grad():
            model.model.norm.weight.mul_(norm_scale / model.model.norm.weight.abs().max())
        assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
    return HFEngine(model, eos_id=1, pad_id=0, version=version)


def test_a_newest_version_whose_finite_weights_overflow_the_logits_is_broken_and_sampled_before(
        monkeypatch, tmp_path):
    """Version 7's weights are finite but huge (its final norm at 3e38): sampling at it raised torch's
    RuntimeError out of `make`, and the worker stopped on every restart while 7 was the newest. It is now
    marked broken and the rollouts are sampled, under the same nonce, at version 6, where the gradient is
    taken too."""
    import torch

    import krill.protocol.work as work_module
    from krill.rl.engine import SamplingParams
    from krill.worker.behaviors import Behavior

    lines: list[str] = []
    source, calls = _source(monkeypatch, {}, lines)
    source.chain = SimpleNamespace(run_of=lambda run_id: SimpleNamespace(latest_version=7))
    source.spec = SimpleNamespace(run_id=RUN)
    source._tokenizer, source._task = SimpleNamespace(pad_token_id=0), object()
    contributor = _contributor(tmp_path, lines=lines)
    contributor.source = source
    engines = {7: _tiny_engine(7, norm_scale=3e38), 6: _tiny_engine(6)}
    contributor.behaviour = SimpleNamespace(at=lambda v: (source.version(v), engines[v])[1])
    contributor.learner = SimpleNamespace(at=lambda v: ("model", source.version(v)))
    behavior = Behavior()

    def sample(work):
        rollouts = work.engine.generate([[2, 5, 6]] * 4, SamplingParams(max_new_tokens=5), seed=work.nonce)
        return SimpleNamespace(rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]), seconds=0.1, rollouts=rollouts,
                               sampled_at=work.engine.version, nonce=work.nonce)

    monkeypatch.setattr(behavior, "sample", sample)
    monkeypatch.setattr(work_module, "learn", lambda spec, model, state, sampled, shards, pad: SimpleNamespace(
        values={0: {}}, seconds=0.2, learner_version=state.v))
    contributor.behavior = behavior
    made = contributor.make()
    assert (made.behaviour_version, made.model_version, made.sampled.sampled_at) == (6, 6, 6)
    assert made.learned.learner_version == 6 and source.is_broken(7) and "NonFiniteLogitsError" in source.broken[7]
    assert made.nonce == made.sampled.nonce == 0 and contributor.state.next_nonce == 1  # the nonce is kept
    assert sum("version 7 is broken and skipped" in line for line in lines) == 1
