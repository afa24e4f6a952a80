"""Slashing: a quorum of failing attestations gets the commit slashed once, and the worker jailed and excluded."""

from __future__ import annotations

import hashlib

from conftest import index_with_headers, wait_for  # at import: later, 'conftest' is whichever ran last

from krill.db.models import Contribution, ContributionStatus, RejectionCode


def test_failing_quorum_slashes_jails_and_excludes_the_worker(coordinator_env):
    from krill.coordinator.loop import Coordinator, LoopOptions

    env = coordinator_env()
    (honest, w_honest), (cheat, w_cheat) = env.stake(1), env.stake(2)
    verifier, _ = env.stake(10)
    commits = {}
    for name, account, who, nonce in (("honest", honest, w_honest, 0), ("bad", cheat, w_cheat, 0),
                                      ("later", cheat, w_cheat, 1)):
        header, files = env.produce(who, nonce=nonce, forge_rewards=name == "bad")
        env.upload(header, files)
        commits[name] = env.commit(account, header)
    v = env.chain.as_account(verifier)
    v.attest(commits["honest"], True, hashlib.sha256(b"evidence ok").digest())
    v.attest(commits["bad"], False, hashlib.sha256(b"evidence rewards differ").digest())

    ctx, indexer = env.context()
    lines: list[str] = []
    coordinator = Coordinator(ctx, indexer, LoopOptions(eval_every=0), echo=lines.append)
    assert coordinator.step() == []  # one eligible contribution: K = 2 not reached
    assert env.chain.commit_of(commits["bad"]).slashed
    assert env.chain.stake_of(cheat.address).jailed
    assert not env.chain.stake_of(honest.address).jailed and not env.chain.commit_of(commits["honest"]).slashed
    assert env.chain.claimable_of(verifier.address) > 0  # the failing verifier's bounty
    assert any(line.startswith(f"slashed commit {commits['bad']}") for line in lines), lines

    with ctx.db.session() as s:
        rows = {name: s.get(Contribution, cid) for name, cid in commits.items()}
    assert rows["honest"].status == ContributionStatus.ACCEPTED and rows["honest"].aggregated_version is None
    for name in ("bad", "later"):
        assert (rows[name].status, rows[name].reason_code) == (ContributionStatus.REJECTED, RejectionCode.JAILED)

    # Another pass: nothing is slashed twice, nothing crashes.
    lines.clear()
    assert coordinator.step() == []
    assert not any("slash" in line for line in lines), lines


def test_a_failing_quorum_the_coordinators_replay_refutes_is_not_slashed(coordinator_env):
    """Any staked verifier may attest; one that fails honest work gets no slash, no bounty, and no
    effect on the worker's trust."""
    from krill.coordinator.confirm import Refutation
    from krill.coordinator.loop import Coordinator, LoopOptions
    from krill.db.models import Participant

    env = coordinator_env()
    (honest, w_honest), (liar, _) = env.stake(1), env.stake(10)
    header, files = env.produce(w_honest, nonce=0)
    env.upload(header, files)
    commit = env.commit(honest, header)
    env.chain.as_account(liar).attest(commit, False, hashlib.sha256(b"made-up evidence").digest())

    ctx, indexer = env.context()
    lines: list[str] = []
    coordinator = Coordinator(ctx, indexer, LoopOptions(eval_every=0), echo=lines.append)
    assert coordinator.step() == []
    assert not env.chain.commit_of(commit).slashed and not env.chain.stake_of(honest.address).jailed
    assert env.chain.claimable_of(liar.address) == 0
    assert any(f"commit {commit}" in line and "refuted by the coordinator's replay" in line for line in lines), lines
    with ctx.db.session() as s:
        refutation = s.get(Refutation, (ctx.run_hex, commit))
        row = s.get(Contribution, commit)
        assert s.get(Participant, honest.address.lower()).checks_failed == 1  # the index counts the verdict...
    assert "resample" in refutation.detail and "gradient" in refutation.detail
    assert row.status == ContributionStatus.ACCEPTED

    from krill.coordinator.close import decide

    header2, files2 = env.produce(w_honest, nonce=1)  # K = 2: the second contribution closes version 1
    env.upload(header2, files2)
    env.commit(honest, header2)
    indexer.sync()
    from krill.coordinator.ingest import ingest

    ingest(ctx, next_version=1)
    decision = decide(ctx, 1)
    assert decision is not None and {e["trust"] for e in decision.accepted} == {repr(0.25)}  # ...trust does not

    lines.clear()  # another pass: the refuted commit is not replayed again
    coordinator.step()
    assert not any(f"commit {commit}" in line for line in lines), lines


def test_content_never_uploaded_is_slashed_after_the_deadline_though_ingest_found_it_stale(coordinator_env):
    """Ingest rejects a commit whose content never came as stale long before its deadline (max staleness
    0 here): the failing quorum on it was never slashed, and its content was fetched again on the
    coordinator's thread on every pass. The decision is the commit's own age against the deadline."""
    import time

    from krill.coordinator.loop import Coordinator, LoopOptions
    from krill.coordinator.slash import slash_due

    env = coordinator_env()
    (a1, w1), (a2, w2), (a3, w3) = env.stake(1), env.stake(2), env.stake(3)
    verifier, _ = env.stake(10)
    for account, who in ((a1, w1), (a2, w2)):
        header, files = env.produce(who, nonce=0)
        env.upload(header, files)
        env.commit(account, header)
    junk, _ = env.produce(w3, nonce=0)
    junk_id = env.commit(a3, junk)  # header and files never uploaded

    ctx, indexer = env.context()
    lines: list[str] = []
    coordinator = Coordinator(ctx, indexer, LoopOptions(eval_every=0), echo=lines.append)
    assert [f.version for f in coordinator.step()] == [1]
    coordinator.step()
    with ctx.db.session() as s:
        row = s.get(Contribution, junk_id)
    assert (row.status, row.reason_code) == (ContributionStatus.REJECTED, RejectionCode.STALE)
    env.chain.as_account(verifier).attest(junk_id, False, hashlib.sha256(b"unavailable").digest())
    indexer.sync()
    assert slash_due(ctx) == []  # missing, but not yet for the run's deadline (600 s): wait
    assert not env.chain.commit_of(junk_id).slashed
    later = time.time() + ctx.spec.version.deadline_s + 1
    deadline = time.monotonic() + 30
    while not (outcomes := slash_due(ctx, now=later)) and time.monotonic() < deadline:
        time.sleep(0.2)  # the confirming fetch runs on the fetch threads; a pass waits 2 s at most
    assert [(o.commit_id, o.amount is not None) for o in outcomes] == [(junk_id, True)], outcomes
    assert env.chain.commit_of(junk_id).slashed and env.chain.stake_of(a3.address).jailed


def test_content_ingest_found_unavailable_but_there_now_is_replayed_before_a_slash(coordinator_env):
    """The honest content came after ingest's deadline (rejected as unavailable, not folded); one verifier
    then attests a false FAIL. The coordinator fetches and replays it, and refuses to slash."""
    import time

    from krill.coordinator.confirm import confirm_failure
    from krill.coordinator.ingest import ingest

    env = coordinator_env()
    account, who = env.stake(1)
    liar, _ = env.stake(10)
    header, files = env.produce(who, nonce=0)
    commit_id = env.commit(account, header)  # committed; the content is uploaded late
    ctx, indexer = env.context()
    indexer.sync()
    later = time.time() + ctx.spec.version.deadline_s + 1
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ingest(ctx, 1, now=later)
        with ctx.db.session() as s:
            row = s.get(Contribution, commit_id)
        if row is not None and row.reason_code == RejectionCode.UNAVAILABLE:
            break
        time.sleep(0.2)
    assert row.reason_code == RejectionCode.UNAVAILABLE, (row.status, row.reason)
    env.upload(header, files)
    env.chain.as_account(liar).attest(commit_id, False, hashlib.sha256(b"made-up evidence").digest())
    indexer.sync()
    deadline = time.monotonic() + 30
    while (got := confirm_failure(ctx, commit_id, later)).confirmed is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert got.confirmed is False, got.detail  # refuted by the replay, not slashed on ingest's old verdict


def test_content_still_missing_when_the_window_closes_is_confirmed_whatever_the_deadline(coordinator_env):
    """The worker's stake is released `unbondingBlocks` after its commit's window: a wall-clock deadline
    longer than that must not keep the coordinator from confirming content that never came."""
    import time

    from krill.chain.rpc import mine
    from krill.coordinator.confirm import confirm_failure

    env = coordinator_env()
    account, who = env.stake(1)
    verifier, _ = env.stake(10)
    junk, _ = env.produce(who, nonce=0)
    junk_id = env.commit(account, junk)  # never uploaded
    env.chain.as_account(verifier).attest(junk_id, False, hashlib.sha256(b"unavailable").digest())
    ctx, indexer = env.context()
    indexer.sync()

    def decided():
        """confirm_failure once the content's fetch has finished (it runs on the fetch threads)."""
        deadline = time.monotonic() + 30
        while "still being fetched" in (got := confirm_failure(ctx, junk_id, time.time())).detail \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        return got

    first = decided()
    assert first.confirmed is None and "not fetched yet" in first.detail  # within the window and the deadline
    mine(env.chain.w3, ctx.spec.chain.challenge_window_blocks + 1)
    got = decided()
    assert got.confirmed is True and "challenge window closed" in got.detail, got.detail


def test_only_verdicts_of_selected_verifiers_count_towards_trust(coordinator_env):
    """Anyone staked may attest, so a worker's own verifiers could pass its commits; only the verdict of a
    verifier the commit's sealed randomness selected moves trust, and only if the verifier's key was staked
    before the randomness was known (else it could be ground to be selected)."""
    from nacl.signing import SigningKey

    from krill.chain.deploy import TOKEN
    from krill.chain.rpc import dev_account
    from krill.chain.types import Role
    from krill.coordinator.close import decide
    from krill.coordinator.ingest import ingest
    from krill.coordinator.journal import ensure_tables
    from krill.protocol.selection import drawn

    env = coordinator_env()
    worker, who = env.stake(1)
    ppm = env.spec.chain.check_probability_ppm

    def key(seed: int) -> bytes:
        return bytes(SigningKey(seed.to_bytes(32, "big")).verify_key)

    def verifier(index: int, verifier_key: bytes):
        client = env.chain.as_account(dev_account(index))
        client.approve_stake(100 * TOKEN)
        client.stake(Role.VERIFIER, 100 * TOKEN, verifier_key)
        return client

    early_key = key(1)
    early = verifier(10, early_key)  # staked before the commit: its key cannot depend on the randomness
    ids = []
    for nonce in (0, 1):  # K = 2: the second closes version 1
        header, files = env.produce(who, nonce=nonce)
        env.upload(header, files)
        ids.append(env.commit(worker, header))
    randomness = env.chain.seal_randomness_now(ids[0])
    ground = next(k for k in map(key, range(2, 200)) if drawn(randomness, ids[0], k, ppm))
    late = verifier(11, ground)  # staked once the randomness is known, with a key the draw selects
    for client in (early, late):
        client.attest(ids[0], True, hashlib.sha256(b"ok").digest())

    ctx, indexer = env.context()
    ensure_tables(ctx.db)
    indexer.sync()
    ingest(ctx, next_version=1)
    decision = decide(ctx, 1)
    # prior Beta(1, 3); the early verifier's pass counts when the draw selected it, the late one's never
    passes = int(drawn(randomness, ids[0], early_key, ppm))
    assert decision is not None and {e["trust"] for e in decision.accepted} == {repr((1 + passes) / (4 + passes))}


def test_the_audit_judges_a_declined_slash_by_the_coordinators_replay(coordinator_env):
    """`krill audit` replays a commit left unslashed at quorum with the checks the coordinator ran: honest
    work (the failing verdicts were false) justifies declining, a forgery does not, and a payload nobody
    can read cannot be judged."""
    from krill.audit.refusals import judge_refusal
    from krill.audit.source import AuditSource

    env = coordinator_env()
    (honest, w_honest), (cheat, w_cheat) = env.stake(1), env.stake(2)
    commits = {}
    for name, account, who in (("honest", honest, w_honest), ("forged", cheat, w_cheat)):
        header, files = env.produce(who, nonce=0, forge_rewards=name == "forged")
        env.upload(header, files)
        commits[name] = env.commit(account, header)
    withheld, _ = env.produce(w_honest, nonce=1)
    commits["withheld"] = env.commit(honest, withheld)  # never uploaded

    source = AuditSource(env.chain, env.store, env.spec)
    judged = {name: judge_refusal(source, commit) for name, commit in commits.items()}
    assert judged["honest"].justified is True, judged["honest"]
    assert "passes every check" in judged["honest"].detail
    assert judged["forged"].justified is False and "the replay fails it at rewards:" in judged["forged"].detail
    assert judged["withheld"].justified is None and "cannot replay it: not available" in judged["withheld"].detail


def test_the_audit_judges_a_slash_by_its_grounds(coordinator_env):
    """A dishonest coordinator and one staked verifier can jail honest work (quorum 1): the audit used to
    count any slashed commit as done right. (Its timing is judged in tests/unit/audit.)"""
    from krill.audit.ledger import judge_slash
    from krill.audit.source import AuditSource
    from krill.payload.canonical import canonical_json

    env = coordinator_env()
    (honest, w_honest), (late, w_late), (cheat, w_cheat) = env.stake(1), env.stake(2), env.stake(3)
    (liar, _), (verifier, _) = env.stake(10), env.stake(11)
    window = env.spec.chain.challenge_window_blocks

    def slashed_after(account, who, reason: str, forge: bool = False) -> int:
        header, files = env.produce(who, nonce=0, forge_rewards=forge)
        env.upload(header, files)
        commit_id = env.commit(account, header)
        evidence = canonical_json({"commit_id": commit_id, "reason": reason, "ok": False})
        env.store.put_block(evidence, pin=True)
        env.chain.as_account(liar if reason == "gradient" else verifier).attest(
            commit_id, False, hashlib.sha256(evidence).digest())
        env.chain.slash(commit_id)
        return commit_id

    framed = slashed_after(honest, w_honest, "gradient")  # on the coordinator's own verifier's word
    withheld_then_uploaded = slashed_after(late, w_late, "unavailable")
    forged = slashed_after(cheat, w_cheat, "rewards", forge=True)
    source = AuditSource(env.chain, env.store, env.spec)
    assert "no failing verdict said its content was unavailable" in judge_slash(source, framed, window)
    assert judge_slash(source, withheld_then_uploaded, window) is None  # the audit cannot tell when it came
    assert judge_slash(source, forged, window) is None  # the replay fails it at rewards


def test_a_coordinator_stopping_at_max_versions_first_slashes_what_became_due_while_it_published(coordinator_env):
    """The verifier fails the forged gradient of the last version while the coordinator folds and
    publishes it. The loop ended as soon as the last version was published and settled, with the
    slash due and never made: the cheater kept its stake and could go on under its account."""
    import threading

    from krill.coordinator.loop import Coordinator, LoopOptions

    env = coordinator_env()
    (honest, w_honest), (cheat, w_cheat) = env.stake(1), env.stake(2)
    verifier, _ = env.stake(10)
    commits = {}
    for name, account, who in (("honest", honest, w_honest), ("forged", cheat, w_cheat)):
        header, files = env.produce(who, nonce=0, shift_gradients=name == "forged")
        env.upload(header, files)
        commits[name] = env.commit(account, header)

    ctx, indexer = env.context()
    publish = ctx.chain.publish_version

    def publish_while_the_verifier_attests(*args, **kwargs):
        receipt = publish(*args, **kwargs)
        env.chain.as_account(verifier).attest(commits["forged"], False, hashlib.sha256(b"gradient differs").digest())
        return receipt

    ctx.chain.publish_version = publish_while_the_verifier_attests
    lines: list[str] = []
    stop = threading.Event()
    timer = threading.Timer(120, stop.set)  # a loop that never ends fails here, not at the suite's timeout
    timer.start()
    try:
        Coordinator(ctx, indexer, LoopOptions(poll_interval_s=0.05, eval_every=0, max_versions=1),
                    echo=lines.append).run(stop)
    finally:
        timer.cancel()
    assert not stop.is_set() and env.chain.run_of(env.run_id).latest_version == 1, lines
    assert env.chain.commit_of(commits["forged"]).fail_count == 1
    assert env.chain.commit_of(commits["forged"]).slashed, lines
    assert env.chain.stake_of(cheat.address).jailed and not env.chain.stake_of(honest.address).jailed
    assert any(line.startswith(f"slashed commit {commits['forged']}") for line in lines), lines


def test_withheld_content_is_confirmed_while_the_workers_other_fetches_hang(coordinator_env):
    """The confirming fetch of a commit at the failing quorum is not queued behind ingest's fetches of the same
    worker's other commits: on a networked store each of those waits out the store's timeout, so a worker that
    withheld one commit and committed a few more digests of content nobody has pushed the slash back by one
    timeout per commit, past its release block (`krill.coordinator.margin` counts one timeout)."""
    import os
    import threading
    import time

    from krill.chain.rpc import mine
    from krill.coordinator.confirm import confirm_failure
    from krill.coordinator.ingest import ingest
    from krill.errors import ContentNotFoundError
    from krill.store.cid import digest_to_cid

    env = coordinator_env()
    account, who = env.stake(1)
    verifier, _ = env.stake(10)
    junk, _ = env.produce(who, nonce=0)
    junk_id = env.commit(account, junk)  # never uploaded
    hanging, holding = {}, []
    for nonce in (1, 2, 3):  # digests of content nobody has: the store looks for it until its timeout
        digest = os.urandom(32)
        env.chain.as_account(account).commit(env.run_id, 0, nonce, digest)
        hanging[digest_to_cid(digest)] = nonce
    env.chain.as_account(verifier).attest(junk_id, False, hashlib.sha256(b"unavailable").digest())
    ctx, indexer = env.context()
    index_with_headers(indexer)
    timeout = threading.Event()  # set: the store's timeout has run out
    get = ctx.store.get

    def networked_get(cid, **kwargs):
        if cid in hanging:
            holding.append(cid)
            timeout.wait(60)
            raise ContentNotFoundError(f"no provider for {cid} within the timeout")
        return get(cid, **kwargs)

    ctx.store.get = networked_get
    try:
        ingest(ctx, 1)  # queues the worker's four fetches in its lane; the second hangs
        wait_for(lambda: holding, 30, "the lane's fetch of content nobody has to start")  # else nothing is behind it
        mine(env.chain.w3, ctx.spec.chain.challenge_window_blocks + 1)
        deadline = time.monotonic() + 15
        while "still being fetched" in (got := confirm_failure(ctx, junk_id, time.time())).detail \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        assert got.confirmed is True and "challenge window closed" in got.detail, got.detail
    finally:
        timeout.set()


def test_withheld_content_is_confirmed_while_other_accounts_fetches_hold_every_fetch_thread(coordinator_env):
    """A cheater with as many staked accounts as the coordinator has fetch threads, each with a commit of content
    nobody has, held every thread for a store timeout; the confirming fetch of its withheld commit at the failing
    quorum then waited up to that timeout again for a thread, past the one timeout `krill.coordinator.margin`
    counts. Confirmation fetches run on threads of their own (`krill.store.fetcher.PRIORITY_PREFIX`)."""
    import os
    import threading
    import time

    from krill.chain.rpc import mine
    from krill.coordinator.confirm import confirm_failure
    from krill.coordinator.ingest import ingest
    from krill.errors import ContentNotFoundError
    from krill.store.cid import digest_to_cid

    env = coordinator_env()
    accounts = [env.stake(index) for index in range(1, 9)]
    verifier, _ = env.stake(10)
    account, who = accounts[0]
    junk, _ = env.produce(who, nonce=0)
    junk_id = env.commit(account, junk)  # never uploaded
    hanging = set()
    for other, _ in accounts:  # one digest of content nobody has per account: each holds a fetch thread
        digest = os.urandom(32)
        env.chain.as_account(other).commit(env.run_id, 0, 1, digest)
        hanging.add(digest_to_cid(digest))
    env.chain.as_account(verifier).attest(junk_id, False, hashlib.sha256(b"unavailable").digest())
    ctx, indexer = env.context()
    assert len(accounts) >= ctx.fetcher.threads
    index_with_headers(indexer)
    timeout = threading.Event()  # set: the store's timeout has run out
    get = ctx.store.get
    holding = []

    def networked_get(cid, **kwargs):
        if cid in hanging:
            holding.append(cid)
            timeout.wait(60)
            raise ContentNotFoundError(f"no provider for {cid} within the timeout")
        return get(cid, **kwargs)

    ctx.store.get = networked_get
    try:
        ingest(ctx, 1)  # queues every account's fetches; the hanging ones hold every fetch thread
        # The threads start on their own time: the confirmation is asked only once every one is held.
        wait_for(lambda: len(holding) == ctx.fetcher.threads, 30, "every fetch thread to hold a hanging fetch")
        mine(env.chain.w3, ctx.spec.chain.challenge_window_blocks + 1)
        deadline = time.monotonic() + 15
        while "still being fetched" in (got := confirm_failure(ctx, junk_id, time.time())).detail \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(holding) == ctx.fetcher.threads, holding  # every ordinary thread was held meanwhile
        assert got.confirmed is True and "challenge window closed" in got.detail, got.detail
    finally:
        timeout.set()
