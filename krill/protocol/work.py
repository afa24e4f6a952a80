"""A contribution as a deterministic function of public inputs: produce it, and replay it.

Design decisions:
- One module serves both sides so they cannot drift: `sample` + `learn` + `package` are what an
  honest worker runs; `replay` re-runs the same functions from the committed header and compares.
- Prompt assignment and the sampling seed are keyed by (run seed, worker, behaviour version,
  nonce): the rollouts are sampled before the worker knows which version its learner will hold,
  and the worker's nonce is one counter over all versions, so (version, nonce) never repeats.
- The gradient of shard s is computed at the learner version v (the committed version) and sent
  as values on v's public mask (`VersionState.masks`), encoded with the run's codec.
- Replay checks, cheapest first: the assignment and sampling parameters; rewards recomputed from
  the completions; exact re-sampling from the committed seed (the HF engine on CPU is
  deterministic), which also pins every behaviour log-prob within tolerance; and one shard's
  gradient recomputed on the committed batch (cosine and relative-norm tolerances of the run).
  Every check returns figures, so the evidence document says how far off a failure was.
  Each check stands on its own on a batch that validated: the rewards check fails a sequence
  count other than the assignment's rather than raising (the audit runs it after a failed
  assignment check, on a commit the coordinator rejected).
- The re-sampling check first tries to confirm the claimed tokens as the seed's draws in one
  teacher-forced pass (`krill.rl.engine.replay`: the sampler's noise replayed, every token must be
  the arg-max of its step); only what that does not confirm is generated again token by token,
  and the exact comparison decides. The fast path can only accept.
- The checks take the tolerances as an argument (default the run spec's): a verifier passes the
  looser of the spec's and its calibration table's (`krill.calibration`), and `krill calibrate`
  records the very figures these checks return.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from krill.payload.gradient import GradientShard
from krill.payload.header import HeaderBody, SignedHeader
from krill.payload.header import SamplingParams as WireSampling
from krill.payload.rollout import RolloutBatch
from krill.phases import phase
from krill.protocol.spec import RunSpec, VerifySpec
from krill.protocol.state import VersionState
from krill.rl.advantages import group_advantages
from krill.rl.assign import assign_prompts
from krill.rl.engine.base import Rollouts, SamplingParams
from krill.rl.gradient import shard_gradients

CODECS = {"fp16": "fp16", "bf16": "bf16", "int8": "int8-block"}


def run_codec(spec: RunSpec) -> dict[str, str | int]:
    """The gradient codec and block size the run's contributions must use (`ExpectedContext` fields)."""
    return {"codec": CODECS[spec.compression.dtype], "block_size": spec.compression.block_size}


def derived_seed(spec: RunSpec, purpose: bytes, worker: str, version: int, nonce: int) -> int:
    """A 63-bit seed: H(domain, purpose, run seed, worker, version, nonce)."""
    data = b"krill/seed/v1/" + purpose + spec.run_seed + bytes.fromhex(worker.lower().removeprefix("0x"))
    data += int(version).to_bytes(8, "big") + int(nonce).to_bytes(8, "big")
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big") >> 1


def sampling_params(spec: RunSpec, task) -> SamplingParams:
    r = spec.rollout
    return SamplingParams(temperature=r.temperature_milli / 1000, top_p=r.top_p_milli / 1000,
                          max_new_tokens=r.max_new_tokens or task.max_new_tokens)


@dataclass
class Sampled:
    """Rollouts of one contribution and their rewards."""

    behaviour_version: int
    nonce: int
    prompt_indices: list[int]
    rollouts: Rollouts
    rewards: torch.Tensor
    seconds: float = 0.0


def assigned_problems(spec: RunSpec, task, worker: str, behaviour_version: int, nonce: int):
    """(indices, (prompt text, metadata) of each assigned prompt)."""
    indices = assign_prompts(spec.run_seed, worker, behaviour_version, nonce, spec.rollout.prompts_per_contribution)
    return indices, task.prompts(indices, "train")


def assigned_prompts(spec: RunSpec, task, tokenizer, worker: str, behaviour_version: int, nonce: int):
    """(indices, token ids of each sequence's prompt, metadata of each prompt)."""
    indices, problems = assigned_problems(spec, task, worker, behaviour_version, nonce)
    # One call per prompt, not one batched call: a batched call hands the GIL back and forth around
    # the tokenizer's thread pool, and a worker whose submit thread is busy waited 5 ms per hand-off.
    ids = [tokenizer(text)["input_ids"] for text, _ in problems]
    g = spec.rollout.group_size
    return indices, [list(p) for p in ids for _ in range(g)], [meta for _, meta in problems]


def compute_rewards(spec: RunSpec, task, tokenizer, rollouts: Rollouts, metas: list[dict]) -> torch.Tensor:
    from krill.model.tokenizer import decode_completions

    g = spec.rollout.group_size
    texts = decode_completions(tokenizer, rollouts.completions())
    return torch.tensor([task.reward(metas[i // g], text) for i, text in enumerate(texts)], dtype=torch.float32)


def sample(spec: RunSpec, task, tokenizer, engine, worker: str, nonce: int) -> Sampled:
    """Sample the assigned prompts at the engine's version and reward the completions."""
    started = time.perf_counter()
    version = int(engine.version)
    indices, prompts, metas = assigned_prompts(spec, task, tokenizer, worker, version, nonce)
    seed = derived_seed(spec, b"sampling", worker, version, nonce)
    with phase("rollout"):
        rollouts = engine.generate(prompts, sampling_params(spec, task), seed)
    with phase("reward"):
        rewards = compute_rewards(spec, task, tokenizer, rollouts, metas)
    return Sampled(version, nonce, indices, rollouts, rewards, time.perf_counter() - started)


def group_ids(spec: RunSpec, n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.int64) // spec.rollout.group_size


def gradient_values(spec: RunSpec, learner: torch.nn.Module, learner_state: VersionState, rollouts: Rollouts,
                    rewards: torch.Tensor, shards: list[int], pad_id: int) -> dict[int, dict[str, np.ndarray]]:
    """Per shard: tensor name -> float32 gradient values on the learner version's public mask."""
    advantages = group_advantages(rewards, group_ids(spec, len(rewards)))
    names = {s: learner_state.manifest.shard_names(s) for s in shards}
    result = shard_gradients(learner, rollouts, advantages, names, spec.loss, pad_id=pad_id)
    masks = learner_state.masks()
    return {s: {n: g.reshape(-1)[masks[n]].numpy().astype(np.float32) for n, g in grads.items()}
            for s, grads in result.grads.items()}


@dataclass
class Learned:
    learner_version: int
    values: dict[int, dict[str, np.ndarray]]
    seconds: float


def learn(spec: RunSpec, learner: torch.nn.Module, learner_state: VersionState, sampled: Sampled,
          shards: list[int], pad_id: int) -> Learned:
    started = time.perf_counter()
    with phase("gradient"):
        values = gradient_values(spec, learner, learner_state, sampled.rollouts, sampled.rewards, shards, pad_id)
    return Learned(learner_state.version, values, time.perf_counter() - started)


def rollout_payload(spec: RunSpec, rollouts: Rollouts, rewards: torch.Tensor) -> RolloutBatch:
    """The wire form of `rollouts` (the same flat layout: a copy with the wire dtypes, no per-sequence work)."""
    return RolloutBatch.from_flat(rollouts.tokens.numpy(), rollouts.offsets.numpy(), rollouts.prompt_lengths.numpy(),
                                  rollouts.logprobs.numpy(), rewards.numpy(), group_ids(spec, len(rollouts)).numpy())


def rollouts_from_payload(batch: RolloutBatch, eos_id: int | None = None) -> Rollouts:
    """The engine-side view of a decoded rollout payload (`finished`: ends with `eos_id`)."""
    ends = batch.token_ids[batch.offsets[1:] - 1] if batch.n_sequences else np.zeros(0, np.int32)
    finished = (ends == eos_id) if eos_id is not None else np.zeros(batch.n_sequences, bool)
    return Rollouts(tokens=torch.from_numpy(batch.token_ids.astype(np.int64)),
                    offsets=torch.from_numpy(batch.offsets.astype(np.int64)),
                    prompt_lengths=torch.from_numpy(batch.prompt_lengths.astype(np.int64)),
                    logprobs=torch.from_numpy(batch.logprobs.astype(np.float32)),
                    finished=torch.from_numpy(np.asarray(finished, dtype=bool)))


@dataclass(frozen=True)
class Identity:
    """Who signs: chain coordinates and keys of the worker."""

    chain_id: int
    contract: str
    worker: str
    signing_key: object  # nacl SigningKey


def package(spec: RunSpec, task, who: Identity, learner_state: VersionState, sampled: Sampled,
            learned: Learned) -> tuple[SignedHeader, dict[str, bytes]]:
    """Build and sign the header and files of a contribution."""
    from krill.payload.contribution import build_contribution

    codec = run_codec(spec)
    grads = [GradientShard(s, codec["codec"], values, codec["block_size"]) for s, values in sorted(learned.values.items())]
    r = spec.rollout
    body = dict(run_id=spec.run_id.hex(), chain_id=who.chain_id, contract=who.contract.lower(),
                worker=who.worker.lower(), ed25519_key=bytes(who.signing_key.verify_key).hex(),
                model_version=learned.learner_version, behaviour_version=sampled.behaviour_version,
                manifest_cid=learner_state.manifest_cid, task=spec.task.replace(":", "."),
                prompt_seed=derived_seed(spec, b"prompts", who.worker, sampled.behaviour_version, sampled.nonce),
                nonce=sampled.nonce, engine=spec.engine,
                sampling=WireSampling(temperature_milli=r.temperature_milli, top_p_milli=r.top_p_milli, top_k=0,
                                      max_new_tokens=sampling_params(spec, task).max_new_tokens,
                                      seed=derived_seed(spec, b"sampling", who.worker, sampled.behaviour_version,
                                                        sampled.nonce)))
    return build_contribution(body, rollout_payload(spec, sampled.rollouts, sampled.rewards), grads,
                              who.signing_key, spec.limits)


# --------------------------------------------------------------------------------------------
# Replay (verifier side)


@dataclass
class CheckOutcome:
    name: str
    ok: bool
    detail: str
    figures: dict = field(default_factory=dict)


def check_assignment(spec: RunSpec, task, tokenizer, header: HeaderBody, batch: RolloutBatch) -> CheckOutcome:
    """Prompts, group layout, seeds and sampling parameters are exactly what the run assigns."""
    b, worker, nonce = header.behaviour_version, header.worker, header.nonce
    problems = []
    if header.task != spec.task.replace(":", "."):
        problems.append(f"task {header.task!r} is not the run's {spec.task!r}")
    if header.prompt_seed != derived_seed(spec, b"prompts", worker, b, nonce):
        problems.append("prompt_seed is not H(run, worker, behaviour version, nonce)")
    s = header.sampling
    want_max = spec.rollout.max_new_tokens or task.max_new_tokens
    if (s.temperature_milli, s.top_p_milli, s.top_k, s.max_new_tokens) != (
            spec.rollout.temperature_milli, spec.rollout.top_p_milli, 0, want_max):
        problems.append("sampling parameters differ from the run spec")
    if s.seed != derived_seed(spec, b"sampling", worker, b, nonce):
        problems.append("sampling seed is not H(run, worker, behaviour version, nonce)")
    _, prompts, _ = assigned_prompts(spec, task, tokenizer, worker, b, nonce)
    if batch.n_sequences != len(prompts):
        problems.append(f"{batch.n_sequences} sequences, the assignment has {len(prompts)}")
    else:
        tokens, offsets, lengths = batch.token_ids.tolist(), batch.offsets.tolist(), batch.prompt_lengths.tolist()
        wrong = [i for i, p in enumerate(prompts) if tokens[offsets[i]:offsets[i] + lengths[i]] != p]
        if wrong:
            problems.append(f"{len(wrong)} sequences do not start with their assigned prompt (first: {wrong[0]})")
        if batch.group_ids.tolist() != group_ids(spec, len(prompts)).tolist():
            problems.append("group ids are not the assignment's layout")
        lengths = np.diff(batch.offsets) - batch.prompt_lengths
        if (lengths > want_max).any() or (lengths < 1).any():
            problems.append("a completion is empty or longer than max_new_tokens")
    return CheckOutcome("assignment", not problems, "; ".join(problems) or "prompts, seeds and parameters match")


def check_rewards(spec: RunSpec, task, tokenizer, header: HeaderBody, batch: RolloutBatch) -> CheckOutcome:
    """Every claimed reward is the task's reward of its completion. A batch whose sequence count is not
    the assignment's fails here too (whoever runs this check without the assignment's first, the audit
    does, must get an outcome, not an IndexError from a sequence without a prompt)."""
    _, problems = assigned_problems(spec, task, header.worker, header.behaviour_version, header.nonce)
    metas = [meta for _, meta in problems]
    want = len(metas) * spec.rollout.group_size
    if batch.n_sequences != want:
        return CheckOutcome("rewards", False, f"{batch.n_sequences} sequences, the assignment has {want}: "
                            "rewards not recomputed", {"sequences": batch.n_sequences, "assigned": want})
    rollouts = rollouts_from_payload(batch)
    recomputed = compute_rewards(spec, task, tokenizer, rollouts, metas).numpy()
    wrong = int(np.sum(recomputed != batch.rewards))
    return CheckOutcome("rewards", wrong == 0, f"{wrong} of {len(recomputed)} rewards differ from the task's",
                        {"mismatched": wrong, "claimed_mean": float(batch.rewards.mean()),
                         "recomputed_mean": float(recomputed.mean())})


def teacher_logprob_diff(engine, claimed: Rollouts, temperature: float) -> float:
    """Max |claimed behaviour log-prob - teacher-forced log-prob under the engine's policy| at the
    sampling `temperature` (the claimed log-probs are the sampler's, of logits / temperature)."""
    if not claimed.logprobs.numel():
        return 0.0
    return float((claimed.logprobs - engine.logprobs(claimed, temperature)).abs().max())


def check_resample(spec: RunSpec, task, tokenizer, header: HeaderBody, batch: RolloutBatch, engine,
                   verify: VerifySpec | None = None) -> CheckOutcome:
    """Re-sample from the committed seed at the behaviour version: tokens equal, log-probs within tolerance.

    `verify`: the tolerances to apply (default the run spec's; a verifier passes the looser of the
    spec's and its calibration table's, `krill.calibration.table.verifier_tolerances`).
    """
    verify = verify or spec.verify
    _, prompts, _ = assigned_prompts(spec, task, tokenizer, header.worker, header.behaviour_version, header.nonce)
    params = sampling_params(spec, task)
    claimed = rollouts_from_payload(batch)
    fast = _confirm_draws(engine, claimed, prompts, params, header.sampling.seed, verify.logprob_abs_tol)
    if fast is not None:
        return fast
    again = engine.generate(prompts, params, header.sampling.seed)
    mine, theirs = claimed.sequences(), again.sequences()
    token_mismatch = sum(a != b for a, b in zip(mine, theirs, strict=False)) + abs(len(mine) - len(theirs))
    figures = {"sequences": len(again), "token_mismatches": int(token_mismatch)}
    if token_mismatch == 0:
        diff = float((claimed.logprobs - again.logprobs).abs().max()) if claimed.logprobs.numel() else 0.0
        figures["max_logprob_diff"] = diff
        ok = diff <= verify.logprob_abs_tol
        return CheckOutcome("resample", ok, f"tokens re-sampled exactly; max log-prob difference {diff:.2e}", figures)
    # Tokens differ: still measure how plausible the claimed tokens are under the policy.
    diff = teacher_logprob_diff(engine, claimed, params.temperature)
    figures["max_logprob_diff"] = diff
    ok = not verify.exact_resample and diff <= verify.logprob_abs_tol
    return CheckOutcome("resample", ok, f"{token_mismatch} of {len(again)} sequences differ from the re-sample; "
                        f"teacher-forced log-prob difference {diff:.2e}", figures)


def _confirm_draws(engine, claimed: Rollouts, prompts: list[list[int]], params, seed: int,
                   logprob_abs_tol: float) -> CheckOutcome | None:
    """The passing resample outcome when one teacher-forced pass confirms every claimed token as the seed's
    draw (`krill.rl.engine.replay`); None sends the check to the exact re-generation."""
    from krill.rl.engine.hf import HFEngine
    from krill.rl.engine.replay import fast_path_available, replay_draws

    if not isinstance(engine, HFEngine) or not fast_path_available():
        return None
    lengths = claimed.prompt_lengths.tolist()
    if len(lengths) != len(prompts) or [s[:n] for s, n in zip(claimed.sequences(), lengths, strict=True)] != prompts:
        return None
    replayed = replay_draws(engine.model, claimed, params, seed, engine.eos_id, engine.pad_id, logprob_abs_tol)
    if not replayed.confirmed:
        return None
    return CheckOutcome("resample", True, f"every token confirmed as the seed's draw in one teacher-forced pass; "
                        f"max log-prob difference {replayed.max_logprob_diff:.2e}",
                        {"sequences": len(prompts), "token_mismatches": 0,
                         "max_logprob_diff": replayed.max_logprob_diff, "fast_path": True})


def check_gradient(spec: RunSpec, header: HeaderBody, batch: RolloutBatch, claimed: dict[str, np.ndarray],
                   shard: int, learner: torch.nn.Module, learner_state: VersionState, pad_id: int,
                   verify: VerifySpec | None = None) -> CheckOutcome:
    """Recompute one shard's gradient on the committed batch; cosine and relative norm within `verify`."""
    verify = verify or spec.verify
    rollouts = rollouts_from_payload(batch)
    rewards = torch.from_numpy(batch.rewards.astype(np.float32))
    values = gradient_values(spec, learner, learner_state, rollouts, rewards, [shard], pad_id)[shard]
    a = np.concatenate([claimed[n].astype(np.float64) for n in sorted(values)])
    b = np.concatenate([values[n].astype(np.float64) for n in sorted(values)])
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 and nb == 0.0:
        return CheckOutcome("gradient", True, f"shard {shard}: both gradients are zero",
                            {"shard": shard, "cosine": 1.0, "rel_norm_diff": 0.0})
    cosine = float(a @ b / (na * nb)) if na > 0 and nb > 0 else 0.0
    rel = abs(na - nb) / max(nb, 1e-12)
    ok = cosine >= verify.grad_min_cosine and rel <= verify.grad_norm_rel_tol
    return CheckOutcome("gradient", ok, f"shard {shard}: cosine {cosine:.5f}, relative norm difference {rel:.4f}",
                        {"shard": shard, "cosine": cosine, "rel_norm_diff": rel, "claimed_norm": na, "recomputed_norm": nb})
