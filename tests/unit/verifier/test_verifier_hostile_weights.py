"""The verifier on a version whose weights are finite but overflow the logits (a norm scaled to 3e38): the
version cannot be evaluated, which is the run's data failing (`RunDataUnavailable`: retried, never attested),
not a failed check of the worker nor a bug. The stages before `resample` and the two checks' comparisons are
faked; the engines are real tiny models, so the errors are the ones such weights raise."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest
import torch

import krill.protocol.work as work_module
import krill.verifier.replay as replay_module
from krill.protocol.work import CheckOutcome
from krill.rl.engine import HFEngine, SamplingParams
from krill.store.fetcher import Fetcher
from krill.verifier.replay import Replayer, RunDataUnavailable
from krill.verifier.state import Job

WORKER = "0x" + "ab" * 20
PROMPTS = [[2, 5, 6]] * 4
PARAMS = SamplingParams(max_new_tokens=5)


def _engine(version: int, hostile: bool) -> HFEngine:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, intermediate_size=64, max_position_embeddings=64,
                      eos_token_id=1, pad_token_id=0, bos_token_id=2, tie_word_embeddings=False)
    torch.manual_seed(3)
    model = LlamaForCausalLM(cfg).eval()
    if hostile:
        with torch.no_grad():
            model.model.norm.weight.mul_(3e38 / model.model.norm.weight.abs().max())
        assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
    return HFEngine(model, eos_id=1, pad_id=0, version=version)


def _replayer(monkeypatch, engines: dict[int, HFEngine], behaviour: int, recomputed_norm: float) -> Replayer:
    """A Replayer whose header and payload pass as given; `resample` re-generates at the behaviour version (the
    exact path) and `gradient` reports a recomputed gradient of norm `recomputed_norm` that fails the check."""
    header = SimpleNamespace(behaviour_version=behaviour, files={})
    replayer = Replayer.__new__(Replayer)
    replayer.spec = SimpleNamespace(run_id=b"\x01" * 32, limits=SimpleNamespace(max_header_bytes=4096),
                                    staleness=SimpleNamespace(max_staleness=2),
                                    compression=SimpleNamespace(dtype="fp16", block_size=32),
                                    loss=SimpleNamespace(temperature=1.0))
    replayer.chain = SimpleNamespace(stake_of=lambda worker: SimpleNamespace(ed25519_public_key=b"\x05" * 32))
    replayer.store = SimpleNamespace(get=lambda cid, max_bytes=None: b"header")
    replayer.chain_id, replayer.contract, replayer.verifier_key = 31337, "0x" + "cc" * 20, b"\x07" * 32
    replayer.verify = None
    replayer._fetcher = Fetcher()
    replayer.policies = SimpleNamespace(
        state=lambda v: SimpleNamespace(manifest_cid="bafy"), grad_lengths=lambda v: {0: {}}, task=lambda: None,
        tokenizer=lambda: SimpleNamespace(pad_token_id=0), engine=lambda v: engines[v], model=lambda v: None,
        load_seconds=0.0)
    rollouts = _engine(0, hostile=False).generate(PROMPTS, PARAMS, seed=0)  # what the worker claims
    replayer._payload = lambda *args: SimpleNamespace(
        rollouts=SimpleNamespace(n_sequences=4, n_tokens=int(rollouts.tokens.numel())),
        gradients={0: SimpleNamespace(values={})})
    monkeypatch.setattr(replay_module, "_check_header", lambda *args: header)
    ok = CheckOutcome("ok", True, "faked", {})
    monkeypatch.setattr(work_module, "check_assignment", lambda *args: ok)
    monkeypatch.setattr(work_module, "check_rewards", lambda *args: ok)

    def check_resample(spec, task, tok, header, batch, engine, verify):
        again = engine.generate(PROMPTS, PARAMS, seed=0)
        return CheckOutcome("resample", torch.equal(again.tokens, rollouts.tokens), "re-sampled", {})

    monkeypatch.setattr(work_module, "check_resample", check_resample)
    monkeypatch.setattr(work_module, "check_gradient", lambda *args: CheckOutcome(
        "gradient", False, "cosine nan", {"cosine": float("nan"), "recomputed_norm": recomputed_norm}))
    monkeypatch.setattr(work_module, "rollouts_from_payload", lambda batch: rollouts)
    return replayer


def _job(version: int) -> Job:
    return Job(7, WORKER, version, 0, hashlib.sha256(b"header").digest(), 100)


def test_a_behaviour_version_whose_logits_overflow_is_the_runs_data_not_the_workers_fault(monkeypatch):
    """Re-sampling at such a version raised torch's RuntimeError (the loop recorded a bug, not attested); the
    engine's own error, an `EngineError`, would have failed the worker's `resample` check."""
    replayer = _replayer(monkeypatch, {3: _engine(3, hostile=True), 2: _engine(2, hostile=False)}, 3, 1.0)
    with pytest.raises(RunDataUnavailable, match="version 3 cannot be evaluated"):
        replayer.replay(_job(3), b"\x09" * 32)


def test_a_gradient_that_is_not_finite_at_a_committed_version_whose_logits_overflow_is_not_the_workers_fault(
        monkeypatch):
    """Sampled at version 2 (sound), committed at 3, whose weights overflow: the recomputed gradient is NaN and
    failed the worker's `gradient` check."""
    replayer = _replayer(monkeypatch, {3: _engine(3, hostile=True), 2: _engine(2, hostile=False)}, 2, float("nan"))
    with pytest.raises(RunDataUnavailable, match="version 3 cannot be evaluated"):
        replayer.replay(_job(3), b"\x09" * 32)


def test_a_gradient_that_is_not_finite_at_a_sound_version_still_fails_the_worker(monkeypatch):
    """The same NaN recomputation where the committed version's logits are finite: the worker's batch made it
    (an honest worker's own gradient would be as NaN, and never committed), so the check fails as before."""
    replayer = _replayer(monkeypatch, {3: _engine(3, hostile=False), 2: _engine(2, hostile=False)}, 2, float("nan"))
    result = replayer.replay(_job(3), b"\x09" * 32)
    assert (result.ok, result.reason) == (False, "gradient")
    assert [c.name for c in result.checks] == ["signature", "payload", "assignment", "rewards", "resample", "gradient"]
