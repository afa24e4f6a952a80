"""Replay one selected (or corroborated) commit, cheapest check first, and stop at the first failure.

Design decisions:
- Stages, in order of cost: `signature` (the header's digest, canonical form, context named by
  the chain, and its Ed25519 signature against the key the worker STAKED, before any file is
  fetched); `payload` (every file fetched with the size the signed header states as the cap,
  then sizes, hashes, CIDs and tensor decoding via `validate_contribution`); `assignment`
  (prompts, seeds, sampling parameters, behaviour staleness); `rewards`; `resample` (the claimed
  tokens confirmed as the committed seed's draws at the behaviour version in one teacher-forced
  pass, else exact re-sampling decides); `gradient` (one shard, drawn by
  `select.gradient_shard`; when a failing verdict being corroborated names another, that one
  first and then the drawn one, never the named one instead). The protocol core (`krill.protocol.work`) owns the comparisons, so the worker and the
  verifier cannot drift apart.
- Tolerances: per field the looser of the run spec's and this verifier's calibration table's
  (`krill calibrate`, `verifier.calibration`; default the table shipped with Krill): the spec is
  the public rule, and a verifier never fails honest work because its own hardware is noisier.
- Whose fault: a worker payload that cannot be fetched raises `PayloadUnavailable` (the loop
  retries, and attests "unavailable" only near the end of the window): content the store does
  not find, or blocks that do not hash to their CIDs or do not decode. This verifier's own store
  being unreachable or failing (a 5xx) is never the worker's fault and propagates to the loop. Payload fetches run on a
  `Fetcher`'s threads, one lane per worker, and a replay waits at most `PASS_WAIT_S` for one: on
  a networked store a fetch of content nobody has waits out the store's timeout (60 s on Kubo),
  and a drawn commit of junk used to hold the verifier that long on every retry until the last
  quarter of the window, while the commits it should check waited; a fetch still running raises
  `PayloadStillFetching` (a `PayloadUnavailable` the loop waits longer for, `select.still_fetching_until`)
  and is taken by a later retry. The loop may give a replay less (`wait_s`, its block deadline: at 0.5 s
  a block `PASS_WAIT_S` is four blocks), and all of one replay's fetch waits share that one allowance. Only
  the time spent waiting draws on it: counted from the replay's start, the work between fetches (a
  version's state and masks loaded before the payload's, a signature check on a loaded machine) used it
  up, and a payload on the verifier's own store raised `PayloadStillFetching`, attested `unavailable` from
  `still_fetching_until` on; a version, tokenizer or
  shard of the run that cannot be loaded raises `RunDataUnavailable` (never the worker's fault,
  never attested), whatever the reason: a store fault, or a manifest, record, shard or mask blob
  that fails to parse (`PayloadError`, `ModelError`). Such an error raised while a stage first
  loads a version (the behaviour version's engine in `resample`) would otherwise be caught there
  as the worker's. Errors that untrusted input can provoke (`PayloadError`, `EngineError`,
  `GradientError`, `TaskError`) fail the stage with their field; anything else is a bug and
  propagates.
- A version whose weights are finite but overflow the logits (a norm scaled to 1e38) is the run's
  data failing too: the engine's `NonFiniteLogitsError` (an `EngineError`, which would fail the
  stage) is raised as `RunDataUnavailable` in `resample` (the behaviour version), and a gradient
  recomputed at the committed version that is not finite is checked the same way (one teacher-
  forced pass there, only then) before it can fail the check. A worker cannot be judged at a
  version nobody can evaluate; an honest one never commits there (its own sampling or gradient
  overflows the same way: it skips the version, or drops the contribution as unencodable). Before,
  the sampler's RuntimeError ended the replay as an error (a bug, not attested), and a NaN gradient
  failed the worker.
- Cost (issue 8 compares it with the worker's): version states, models, engines and the
  tokenizer are cached per version (shard tensors are fetched once per version), the task is
  built once, and only one shard's gradient is recomputed. A new version's weights are loaded
  into the least recently used model (built only while fewer than `max_models` exist), as a
  worker reloads its own: building a model costs 11 ms against 1 ms to load weights. The check
  that loads a version's model records the time as `model_load_ms`, a once-per-version cost.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from krill.errors import (
    ContentNotFoundError,
    IntegrityError,
    ModelError,
    PayloadError,
    StoreError,
)
from krill.payload.errors import DigestMismatchError, PayloadTooLargeError, SchemaError, ValueRangeError
from krill.protocol.evidence import CheckRecord, check_record
from krill.protocol.work import CheckOutcome
from krill.store.cid import InvalidCIDError
from krill.store.fetcher import Fetcher
from krill.verifier.select import gradient_shard
from krill.verifier.state import Job


class PayloadUnavailable(StoreError):
    """The worker's header or a file it names cannot be fetched right now."""


class PayloadStillFetching(PayloadUnavailable):
    """A fetch of the worker's header or of a file it names is still running: slow, not known missing."""


class RunDataUnavailable(StoreError):
    """A version, shard or tokenizer of the run cannot be loaded (not the worker's fault)."""


@dataclass
class ReplayResult:
    """The outcome of replaying one commit."""

    ok: bool
    reason: str
    checks: list[CheckRecord]
    failed_field: str | None = None
    behaviour_version: int | None = None
    gradient_shard: int | None = None

    @property
    def failed_check(self) -> str | None:
        return None if self.ok else self.checks[-1].name if self.checks else self.reason


class Policies:
    """Version states, models and engines of one run, cached by version (least recently used out)."""

    def __init__(self, chain, store, spec, max_models: int = 3):
        self.chain, self.store, self.spec = chain, store, spec
        self.max_models = max_models
        self._states: OrderedDict[int, object] = OrderedDict()
        self._models: OrderedDict[int, object] = OrderedDict()
        self._tokenizer = None
        self._task = None
        self.loads = 0
        self.load_seconds = 0.0

    def _load(self, what: str, fn: Callable):
        try:
            return fn()
        except RunDataUnavailable:
            raise
        except (StoreError, ModelError, PayloadError) as exc:  # the run's data, never the worker's
            raise RunDataUnavailable(f"{what}: {type(exc).__name__}: {exc}") from exc

    def state(self, version: int):
        from krill.protocol.state import load_chain_version

        if version not in self._states:
            self._states[version] = self._load(f"version {version}",
                                               lambda: load_chain_version(self.chain, self.store, self.spec, version))
            while len(self._states) > self.max_models + 2:
                self._states.popitem(last=False)
        self._states.move_to_end(version)
        return self._states[version]

    def model(self, version: int):
        """Version `version`'s model: cached, else the least recently used one reloaded (built only while
        fewer than `max_models` exist). The seconds spent loading add to `load_seconds`."""
        from krill.protocol.policy import build_model, load_weights

        if version not in self._models:
            started = time.perf_counter()
            state = self.state(version)
            if len(self._models) >= self.max_models:
                _, model = self._models.popitem(last=False)
                self._load(f"weights of version {version}", lambda: load_weights(model, state))
            else:
                model = self._load(f"weights of version {version}", lambda: build_model(state))
            self._models[version] = model
            self.loads += 1
            self.load_seconds += time.perf_counter() - started
        self._models.move_to_end(version)
        return self._models[version]

    def engine(self, version: int):
        from krill.rl.engine.hf import HFEngine

        tok = self.tokenizer()
        return HFEngine(self.model(version), eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, version=version)

    def tokenizer(self):
        from krill.protocol.policy import load_tokenizer

        if self._tokenizer is None:
            self._tokenizer = self._load("tokenizer", lambda: load_tokenizer(self.state(0)))
        return self._tokenizer

    def task(self):
        from krill.rl.tasks import get_task

        if self._task is None:
            self._task = get_task(self.spec.task)
        return self._task

    def grad_lengths(self, version: int) -> dict[int, dict[str, int]]:
        state = self.state(version)
        masks = self._load(f"masks of version {version}", state.masks)
        return {s: {n: int(masks[n].numel()) for n in state.manifest.shard_names(s)}
                for s in range(state.manifest.num_shards)}


# Errors untrusted input can provoke inside a check: a failed check, never a crash.
def _input_errors() -> tuple[type[Exception], ...]:
    from krill.rl.engine.base import EngineError
    from krill.rl.gradient import GradientError
    from krill.rl.tasks.base import TaskError

    return (PayloadError, EngineError, GradientError, TaskError)


@dataclass
class _Run:
    """Accumulates the stages of one replay."""

    checks: list[CheckRecord] = field(default_factory=list)
    failed_field: str | None = None

    def stage(self, name: str, fn: Callable[[], CheckOutcome]) -> bool:
        started = time.perf_counter()
        try:
            outcome = fn()
        except _input_errors() as exc:
            if isinstance(exc, PayloadError):
                self.failed_field = exc.field
            outcome = CheckOutcome(name, False, str(exc), {"error": type(exc).__name__,
                                                           "field": getattr(exc, "field", None)})
        self.checks.append(check_record(name, outcome.ok, outcome.detail, outcome.figures,
                                        time.perf_counter() - started))
        return outcome.ok


class Replayer:
    """Replays selected commits of one run for one verifier.

    `calibration`: this verifier's tolerance table (`krill calibrate`; default the shipped one);
    the resample and gradient checks apply, per tolerance, the looser of it and the run spec's.
    """

    def __init__(self, chain, store, spec, verifier_key: bytes, chain_id: int, calibration: Path | None = None):
        from krill.calibration.table import verifier_tolerances

        self.chain, self.store, self.spec = chain, store, spec
        self.verify = verifier_tolerances(spec, calibration)
        self.verifier_key = bytes(verifier_key)
        self.chain_id = chain_id
        self.contract = chain.address.lower()
        self.policies = Policies(chain, store, spec)
        self._fetcher = Fetcher()  # payload fetches, one lane per worker (krill.store.fetcher)
        self._wait_left = 0.0  # seconds the replay under way may still wait for its fetches (`replay`'s `wait_s`)

    def warm_up(self) -> float:
        """Load the run's latest version, its model and engine, the tokenizer, the task and the masks
        before any commit is drawn; returns the seconds it took.

        A verifier's first check otherwise pays for importing the model code and building the model:
        in the demo of 2026-12-06 that check's resample took 3.3 s at nice 10, during versions 5-15,
        on the cores the workers and the coordinator share, and it delays the first attestation by
        as much."""
        started = time.perf_counter()
        version = int(self.chain.run_of(self.spec.run_id).latest_version)
        self.policies.task()
        self.policies.engine(version)
        self.policies.grad_lengths(version)
        return time.perf_counter() - started

    # ------------------------------------------------------------------ fetching

    def forget_fetches(self, commit_id: int) -> None:
        """The commit is decided: drop its payload fetches still queued, running or not taken."""
        self._fetcher.forget_where(lambda key: key[0] == commit_id)

    def _fetch(self, job: Job, cid: str, cap: int, name: str) -> bytes:
        """`cid`'s bytes, fetched on the fetch threads in the lane of `job`'s worker; PayloadUnavailable while
        the fetch is still running when the replay's wait allowance is spent (the loop retries the commit later
        and takes it then)."""
        from krill.store.unixfs import ObjectTooLargeError

        key, store = (job.commit_id, name, cid), self.store
        if self._fetcher.submit(job.worker.lower(), key, lambda: store.get(cid, max_bytes=cap)):
            waited = time.monotonic()
            self._fetcher.wait([key], self._wait_left)
            self._wait_left = max(0.0, self._wait_left - (time.monotonic() - waited))
        fetched = self._fetcher.take(key)
        if fetched is None:
            raise PayloadStillFetching(f"{name} ({cid}): still being fetched")
        try:
            return fetched.result()
        except ObjectTooLargeError:
            raise PayloadTooLargeError(f"content of {cid} is larger than the {cap} bytes allowed", field=name) from None
        except (ContentNotFoundError, IntegrityError, InvalidCIDError) as exc:
            raise PayloadUnavailable(f"{name} ({cid}): {exc}") from exc
        # Anything else (this verifier's own store unreachable, or failing with a 5xx) propagates: the
        # loop backs off or retries, and never charges its own store's outage to the worker.

    # ------------------------------------------------------------------ the replay

    def replay(self, job: Job, randomness: bytes, shard: int | None = None,
               wait_s: float | None = None) -> ReplayResult:
        """Every check on `job`, cheapest first; raises PayloadUnavailable / RunDataUnavailable to retry.

        `shard`: recompute this gradient shard too (the one a failing verdict being corroborated names), before
        the drawn one, if the contribution carries it; the result names the last shard recomputed. `wait_s`: the
        longest the replay waits for its payload fetches, all of them together (default `PASS_WAIT_S`)."""
        from krill.payload.contribution import ExpectedContext
        from krill.protocol.work import run_codec
        from krill.store.cid import digest_to_cid
        from krill.store.fetcher import PASS_WAIT_S

        self._wait_left = PASS_WAIT_S if wait_s is None else wait_s

        spec, limits, run = self.spec, self.spec.limits, _Run()
        learner_state = self.policies.state(job.version)
        from web3 import Web3

        staked_key = self.chain.stake_of(Web3.to_checksum_address(job.worker)).ed25519_public_key
        # Everything the header must name is what its commit put on-chain (worker, version, nonce, digest) or
        # the run fixed (codec): a header that names anything else fails `signature` (`payload` for the
        # codec), the worker's fault, since only the worker commits under its own address.
        context = ExpectedContext(run_id=spec.run_id.hex(), chain_id=self.chain_id, contract=self.contract,
                                  worker=job.worker.lower(), ed25519_key=staked_key.hex(), model_version=job.version,
                                  manifest_cid=learner_state.manifest_cid, digest=job.header_digest,
                                  nonce=job.nonce, **run_codec(spec))
        header_bytes = None
        fetch_started = time.perf_counter()
        try:
            header_bytes = self._fetch(job, digest_to_cid(job.header_digest), limits.max_header_bytes, "header")
        except PayloadTooLargeError as exc:
            run.failed_field = exc.field
            run.checks.append(check_record("signature", False, str(exc), {}, time.perf_counter() - fetch_started))
            return self._result(run, None, None)
        header = None

        def signature() -> CheckOutcome:
            nonlocal header
            header = _check_header(header_bytes, limits, context)
            return CheckOutcome("signature", True, "digest, context and Ed25519 signature match the staked key",
                                {"header_bytes": len(header_bytes)})

        if not run.stage("signature", signature):
            return self._result(run, None, None)
        behaviour = header.behaviour_version
        lengths = self.policies.grad_lengths(job.version)
        contribution = None

        def payload() -> CheckOutcome:
            nonlocal contribution
            contribution = self._payload(job, header, header_bytes, context, lengths)
            batch = contribution.rollouts
            return CheckOutcome("payload", True, f"{batch.n_sequences} sequences, {batch.n_tokens} tokens, "
                                f"shards {sorted(contribution.gradients)}",
                                {"bytes": sum(ref.size for ref in header.files.values()),
                                 "sequences": batch.n_sequences, "tokens": batch.n_tokens})

        if not run.stage("payload", payload):
            return self._result(run, behaviour, None)
        task, tok, batch = self.policies.task(), self.policies.tokenizer(), contribution.rollouts

        def assignment() -> CheckOutcome:
            from krill.protocol.work import check_assignment

            staleness = job.version - behaviour
            if staleness > spec.staleness.max_staleness:
                raise ValueRangeError(f"behaviour version {behaviour} is {staleness} versions behind the committed "
                                      f"version {job.version}; the run allows {spec.staleness.max_staleness}",
                                      field="header.behaviour_version")
            return check_assignment(spec, task, tok, header, batch)

        def rewards() -> CheckOutcome:
            from krill.protocol.work import check_rewards

            return check_rewards(spec, task, tok, header, batch)

        def resample() -> CheckOutcome:
            from krill.protocol.work import check_resample

            with _version_fault(behaviour):
                return check_resample(spec, task, tok, header, batch, self.policies.engine(behaviour), self.verify)

        for name, fn in (("assignment", assignment), ("rewards", rewards), ("resample", self._loads_noted(resample))):
            if not run.stage(name, fn):
                return self._result(run, behaviour, None)
        drawn = gradient_shard(randomness, job.commit_id, self.verifier_key, sorted(contribution.gradients))
        # The named shard first (a failing verdict being corroborated names it), then always this verifier's
        # own draw: a named shard never replaces the draw, or a verifier colluding with the worker could
        # steer every check to the honest shard by failing the commit first, naming that shard.
        shards = list(dict.fromkeys(s for s in (shard, drawn) if s in contribution.gradients)) or [None]

        def gradient(checked: int | None) -> CheckOutcome:
            from krill.protocol.work import check_gradient, rollouts_from_payload

            if checked is None:
                return CheckOutcome("gradient", True, "the contribution carries no gradient shard", {})
            outcome = check_gradient(spec, header, batch, contribution.gradients[checked].values, checked,
                                     self.policies.model(job.version), learner_state, tok.pad_token_id, self.verify)
            if not outcome.ok and not math.isfinite(outcome.figures.get("recomputed_norm", 0.0)):
                with _version_fault(job.version):  # the version's logits overflow: not the worker's fault
                    self.policies.engine(job.version).logprobs(rollouts_from_payload(batch), spec.loss.temperature)
            return outcome

        for checked in shards:
            if not run.stage("gradient", self._loads_noted(lambda s=checked: gradient(s))):
                break
        return self._result(run, behaviour, checked)

    def _loads_noted(self, check: Callable[[], CheckOutcome]) -> Callable[[], CheckOutcome]:
        """`check`, with the milliseconds it spent loading a version's model (once per version) in its
        figures as `model_load_ms`, so the per-check cost can be told from the per-version one."""

        def noted() -> CheckOutcome:
            before = self.policies.load_seconds
            outcome = check()
            loaded = self.policies.load_seconds - before
            if loaded:
                outcome.figures["model_load_ms"] = round(1000 * loaded, 1)
            return outcome

        return noted

    def _payload(self, job: Job, header, header_bytes: bytes, context, lengths):
        """Fetch the files the signed header names (its sizes are the caps), then validate everything."""
        from krill.payload.contribution import shard_of, validate_contribution
        from krill.payload.header import ROLLOUTS_FILE

        limits = self.spec.limits
        caps = {}
        for name, ref in header.files.items():
            if name == ROLLOUTS_FILE:
                cap = limits.max_rollout_bytes
            elif shard_of(name) is not None and shard_of(name) in lengths:
                cap = limits.max_grad_bytes
            else:
                raise SchemaError("not a file a contribution may carry", field=f"header.files.{name}")
            if ref.size > cap:
                raise PayloadTooLargeError(f"{ref.size} bytes, over the cap of {cap}", field=f"header.files.{name}.size")
            caps[name] = ref.size
        files = {}
        for name, ref in header.files.items():
            try:
                files[name] = self._fetch(job, ref.cid, caps[name], name)
            except PayloadTooLargeError:
                raise DigestMismatchError(f"more than the {ref.size} bytes the header states",
                                          field=f"{name}.size") from None
        contribution = validate_contribution(header_bytes, files, limits, context, lengths)
        vocab = int(self.policies.state(header.model_version).manifest.architecture.get("vocab_size", 0) or 0)
        ids = contribution.rollouts.token_ids
        if vocab and ids.size and int(ids.max()) >= vocab:
            raise ValueRangeError(f"token id {int(ids.max())} is outside the model's vocabulary of {vocab}",
                                  field="rollouts.token_ids")
        return contribution

    def _result(self, run: _Run, behaviour: int | None, shard: int | None) -> ReplayResult:
        ok = bool(run.checks) and all(c.ok for c in run.checks)
        reason = "passed" if ok else run.checks[-1].name
        return ReplayResult(ok, reason, run.checks, run.failed_field, behaviour, shard)


@contextmanager
def _version_fault(version: int):
    """Raise the engine's `NonFiniteLogitsError` inside as `RunDataUnavailable` (the version's weights overflow
    its logits: never the worker's fault)."""
    from krill.rl.engine.base import NonFiniteLogitsError

    try:
        yield
    except NonFiniteLogitsError as exc:
        raise RunDataUnavailable(f"version {version} cannot be evaluated: {exc}") from exc


def _check_header(header_bytes: bytes, limits, context):
    """Digest, canonical form and schema, context, then the signature against the staked key."""
    from krill.payload.contribution import check_context
    from krill.payload.header import decode_header

    if context.digest is not None and hashlib.sha256(header_bytes).digest() != context.digest:
        raise DigestMismatchError("header bytes do not hash to the committed digest", field="header")
    header = decode_header(header_bytes, limits, verify=False)
    check_context(header, context)
    header.verify(context.ed25519_key)
    return header


def unavailable_result(detail: str, seconds: float) -> ReplayResult:
    """The verdict on a payload that could not be fetched within the window."""
    return ReplayResult(False, "unavailable", [check_record("availability", False, detail, {}, seconds)])

