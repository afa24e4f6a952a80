"""Worker strategies: the honest one, and the attacks a Byzantine worker can mount (`--behavior`).

Design decisions:
- Every attack is a real alternative strategy on the normal code path (`Contributor.prepare` /
  `submit`): it overrides one hook and changes only what a worker controls — which prompts it
  samples and how, the rewards it reports, the gradient values it sends, what it signs with,
  the version it claims, whether it uploads. Everything else (packaging, signing, upload,
  commit, restart safety) is the honest worker's, so each attack isolates one defence.
- The hooks, in pipeline order: `sample` (rollouts), `reported_rewards`, `gradients`, `sign`
  (header and files), `commit_version`, `uploads`. Each default is the honest behaviour.
- What each attack meets (the fault tests assert it; `krill bench robustness` measures it):
  | attack | caught by |
  |---|---|
  | forge-rewards, cherry-pick, copycat | coordinator's cheap replay (rewards / assignment): rejected, never applied; a verifier that checks it fails it -> slash |
  | fabricate-rollouts, lazy, stale-behaviour | verifier's exact re-sample -> slash (folded optimistically at the author's trust until then) |
  | sign-flip, scale, noise, alie, ipm, mimic | verifier's gradient recompute when it samples an attacked shard -> slash; robust aggregation bounds the harm meanwhile |
  | foreign-signature, forged-signature | coordinator (unknown key / bad signature), verifier's signature check |
  | future-version, too-stale-version | the contract refuses the commit |
  | withhold | coordinator: unavailable after the deadline; verifier: unavailable near the window end -> slash |
- Gradient attacks see what a lone attacker can see: its own batch. ALIE and IPM need the spread
  of honest gradients, so the attacker computes one gradient per prompt group (each scaled by the
  number of groups, so their mean is the full-batch gradient) and treats them as the honest rows
  (`krill.rl.attacks.byzantine_updates`). Mimic copies another worker's committed gradient of the
  same version from the public store when there is one (else its own first group's).
- Copycat re-signs another worker's newest committed payload as its own (a fresh nonce): the
  digest differs, so the contract takes it, and only the assignment gives it away.
- Randomness of an attack is seeded from (worker, nonce), so a run replays exactly.
- The names are also listed in the core (`krill.config.WORKER_BEHAVIORS`), which validates
  `worker.behavior` without importing a role; `check_registry` refuses, at import, a registry
  that differs from that list.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from krill.config import WORKER_BEHAVIORS
from krill.errors import ConfigError

if TYPE_CHECKING:  # torch loads only when a strategy runs, not when a config names one
    import torch


@dataclass
class Work:
    """What a strategy may look at: the worker's view of the run while making one contribution."""

    spec: object
    task: object
    tokenizer: object
    who: object                 # krill.protocol.work.Identity
    nonce: int
    chain: object = None
    store: object = None
    source: object = None       # worker RunSource
    engine: object = None       # behaviour engine (set for sampling)
    learner: object = None      # learner model (set for learning)
    learner_state: object = None
    shards: list[int] = field(default_factory=list)

    def seed(self, purpose: str) -> int:
        data = f"krill/attack/{purpose}/{self.who.worker.lower()}/{self.nonce}".encode()
        return int.from_bytes(hashlib.sha256(data).digest()[:8], "big") >> 1


class Behavior:
    """A worker strategy; every hook defaults to the honest behaviour."""

    name: str = ""
    uploads: bool = True

    @property
    def honest(self) -> bool:
        return False

    def sample(self, work: Work):
        from krill.protocol.work import sample

        return sample(work.spec, work.task, work.tokenizer, work.engine, work.who.worker, work.nonce)

    def reported_rewards(self, rewards: torch.Tensor) -> torch.Tensor:
        return rewards

    def gradients(self, work: Work, sampled, values: dict[int, dict[str, np.ndarray]]) -> dict[int, dict[str, np.ndarray]]:
        return values

    def sign(self, work: Work, sampled, learned):
        from krill.protocol.work import package

        return package(work.spec, work.task, work.who, work.learner_state, sampled, learned)

    def commit_version(self, work: Work, version: int, latest: int) -> int:
        return version


class Honest(Behavior):
    name = "honest"

    @property
    def honest(self) -> bool:
        return True


# ---------------------------------------------------------------------------------- rewards


class ForgeRewards(Behavior):
    """Reports 1 - r for every reward: every claim is wrong and the gradient pushes away from right answers."""

    name = "forge-rewards"

    def reported_rewards(self, rewards: torch.Tensor) -> torch.Tensor:
        import torch

        return (1.0 - rewards).to(torch.float32)


# ---------------------------------------------------------------------------------- rollouts


def _subset(rollouts, rows: list[int]):
    from krill.rl.engine.base import Rollouts

    prompts = [rollouts.sequence(i)[:int(rollouts.prompt_lengths[i])] for i in rows]
    return Rollouts.from_lists(prompts, [rollouts.completion(i) for i in rows],
                               [rollouts.completion_logprobs(i).tolist() for i in rows],
                               [bool(rollouts.finished[i]) for i in rows])


class FabricateRollouts(Behavior):
    """Half of each group's completions are the solver's answer, with the policy's own log-probs of it."""

    name = "fabricate-rollouts"

    def sample(self, work: Work):
        import torch

        from krill.protocol.work import assigned_prompts, compute_rewards
        from krill.rl.engine.base import Rollouts

        sampled = super().sample(work)
        r = sampled.rollouts
        _, prompts, metas = assigned_prompts(work.spec, work.task, work.tokenizer, work.who.worker,
                                             sampled.behaviour_version, work.nonce)
        g = work.spec.rollout.group_size
        eos = work.tokenizer.eos_token_id
        completions, finished = [], []
        for i in range(len(r)):
            if i % 2 == 0:
                ids = work.tokenizer(work.task.reference(metas[i // g]), add_special_tokens=False)["input_ids"]
                completions.append(list(ids) + [eos])
                finished.append(True)
            else:
                completions.append(r.completion(i))
                finished.append(bool(r.finished[i]))
        draft = Rollouts.from_lists(prompts, completions, [[0.0] * len(c) for c in completions], finished)
        teacher = work.engine.logprobs(draft)  # consistent-looking: the policy's log-probs of those tokens
        fabricated = replace(draft, logprobs=teacher.to(torch.float32))
        sampled.rollouts = fabricated
        sampled.rewards = compute_rewards(work.spec, work.task, work.tokenizer, fabricated, metas)
        return sampled


def sample_assigned(work: Work, engine, version: int, params=None):
    """The assigned prompts of (worker, `version`, nonce), sampled by `engine` from the committed seed,
    with `params` (default: the run's) — the honest recipe with one input swapped by an attack."""
    import time

    from krill.protocol.work import Sampled, assigned_prompts, compute_rewards, derived_seed, sampling_params

    started = time.perf_counter()
    indices, prompts, metas = assigned_prompts(work.spec, work.task, work.tokenizer, work.who.worker, version,
                                               work.nonce)
    seed = derived_seed(work.spec, b"sampling", work.who.worker, version, work.nonce)
    rollouts = engine.generate(prompts, params or sampling_params(work.spec, work.task), seed)
    rewards = compute_rewards(work.spec, work.task, work.tokenizer, rollouts, metas)
    return Sampled(version, work.nonce, indices, rollouts, rewards, time.perf_counter() - started)


class Lazy(Behavior):
    """Samples half the tokens the run asks for and claims the full budget."""

    name = "lazy"

    def sample(self, work: Work):
        from krill.protocol.work import sampling_params

        params = sampling_params(work.spec, work.task)
        params = params.model_copy(update={"max_new_tokens": max(1, params.max_new_tokens // 2)})
        return sample_assigned(work, work.engine, int(work.engine.version), params)


class CherryPick(Behavior):
    """Samples four times the assigned prompts' worth from other indices and keeps the best groups."""

    name = "cherry-pick"

    def sample(self, work: Work):
        import time

        from krill.protocol.work import Sampled, compute_rewards, sampling_params

        started = time.perf_counter()
        spec, task, tok = work.spec, work.task, work.tokenizer
        version = int(work.engine.version)
        k, g = spec.rollout.prompts_per_contribution, spec.rollout.group_size
        rng = np.random.default_rng(work.seed("cherry-pick"))
        pool = sorted({int(x) for x in rng.integers(0, 2**40, 4 * k)})
        problems = task.prompts(pool, "train")
        prompts = [tok(text)["input_ids"] for text, _ in problems for _ in range(g)]
        metas = [meta for _, meta in problems]
        rollouts = work.engine.generate(prompts, sampling_params(spec, task), work.seed("cherry-pick-sampling"))
        rewards = compute_rewards(spec, task, tok, rollouts, metas)
        means = rewards.reshape(len(pool), g).mean(dim=1)
        best = sorted(sorted(range(len(pool)), key=lambda j: -float(means[j]))[:k])
        rows = [j * g + m for j in best for m in range(g)]
        return Sampled(version, work.nonce, [pool[j] for j in best], _subset(rollouts, rows), rewards[rows],
                       time.perf_counter() - started)


class StaleBehaviour(Behavior):
    """Samples with an older version's weights and claims the newest as the behaviour version."""

    name = "stale-behaviour"

    def sample(self, work: Work):
        from krill.worker.source import BehaviourPolicy

        claimed = int(work.engine.version)
        if claimed == 0:
            return super().sample(work)  # nothing older to use
        return sample_assigned(work, BehaviourPolicy(work.source).at(claimed - 1), claimed)


# ---------------------------------------------------------------------------------- gradients


def group_rows(work: Work, sampled, shard: int, names: list[str]) -> torch.Tensor:
    """One gradient row per prompt group (x number of groups): the honest spread a lone attacker sees."""
    import torch

    from krill.protocol.work import gradient_values, group_ids

    groups = group_ids(work.spec, len(sampled.rewards))
    n = int(groups.max()) + 1
    rows = []
    for j in range(n):
        rewards = torch.where(groups == j, sampled.rewards, torch.zeros_like(sampled.rewards))
        values = gradient_values(work.spec, work.learner, work.learner_state, sampled.rollouts, rewards, [shard],
                                 work.tokenizer.pad_token_id)[shard]
        rows.append(n * torch.from_numpy(np.concatenate([values[name] for name in names])))
    return torch.stack(rows)


class GradientAttack(Behavior):
    """Replaces every shard's gradient by `krill.rl.attacks.byzantine_updates(attack, rows)`."""

    attack: str = ""
    needs_spread = False

    def observed(self, work: Work, sampled, shard: int, names: list[str], own: torch.Tensor) -> torch.Tensor:
        return group_rows(work, sampled, shard, names) if self.needs_spread else own[None]

    def gradients(self, work, sampled, values):
        import torch

        from krill.rl.attacks import byzantine_updates

        out = {}
        for shard, tensors in sorted(values.items()):
            names = sorted(tensors)
            own = torch.from_numpy(np.concatenate([tensors[n] for n in names]).astype(np.float32))
            rows = self.observed(work, sampled, shard, names, own)
            generator = torch.Generator().manual_seed(work.seed(f"{self.attack}/{shard}"))
            attacked = byzantine_updates(self.attack, rows.to(torch.float32), 1, generator)[0].numpy()
            split = np.split(attacked, np.cumsum([tensors[n].size for n in names])[:-1])
            out[shard] = {n: part.astype(np.float32) for n, part in zip(names, split, strict=True)}
        return out


class SignFlip(GradientAttack):
    name = attack = "sign-flip"


class Scale(GradientAttack):
    name = attack = "scale"


class Noise(GradientAttack):
    name = attack = "noise"


class Alie(GradientAttack):
    name = attack = "alie"
    needs_spread = True


class Ipm(GradientAttack):
    name = attack = "ipm"
    needs_spread = True


class Mimic(GradientAttack):
    """Sends another worker's committed gradient of the same version instead of its own."""

    name = attack = "mimic"

    def observed(self, work, sampled, shard, names, own):
        peer = peer_gradient(work, shard, names)
        if peer is not None:
            return peer[None]
        return group_rows(work, sampled, shard, names)[:1]


# ---------------------------------------------------------------------------------- copies


def peer_commits(work: Work, version: int | None = None, lookback_blocks: int = 2000) -> list:
    """Other workers' Committed events of this run, newest first (optionally at one version)."""
    from krill.chain.events import Committed

    head = int(work.chain.block_number())
    events = [e for e in work.chain.events(max(0, head - lookback_blocks), kinds=(Committed,))
              if e.run_id == work.spec.run_id and e.worker.lower() != work.who.worker.lower()
              and (version is None or e.version == version)]
    return sorted(events, key=lambda e: e.commit_id, reverse=True)


def peer_payload(work: Work, event):
    """The validated contribution behind a peer's commit, or None when it is not (yet) in the store."""
    from krill.errors import KrillError
    from krill.payload.contribution import ExpectedContext, validate_contribution
    from krill.payload.header import decode_header
    from krill.store.cid import digest_to_cid

    try:
        header_bytes = work.store.get(digest_to_cid(event.header_digest), max_bytes=work.spec.limits.max_header_bytes)
        header = decode_header(header_bytes, work.spec.limits, verify=False)
        files = {name: work.store.get(ref.cid, max_bytes=ref.size) for name, ref in header.files.items()}
        return validate_contribution(header_bytes, files, work.spec.limits, ExpectedContext(digest=event.header_digest),
                                     work.source.grad_lengths(event.version))
    except KrillError:
        return None


def peer_gradient(work: Work, shard: int, names: list[str]) -> torch.Tensor | None:
    import torch

    version = int(work.learner_state.version)
    for event in peer_commits(work, version)[:8]:
        contribution = peer_payload(work, event)
        grads = contribution.gradients if contribution is not None else {}
        if shard in grads:
            values = grads[shard].values
            if sorted(values) == names:
                return torch.from_numpy(np.concatenate([values[n] for n in names]).astype(np.float32))
    return None


class Copycat(Behavior):
    """Re-signs another worker's newest committed payload as its own, under a fresh nonce."""

    name = "copycat"

    def sign(self, work, sampled, learned):
        import torch

        from krill.protocol.work import Learned, Sampled, package, rollouts_from_payload

        for event in peer_commits(work)[:8]:
            contribution = peer_payload(work, event)
            if contribution is None or event.version != learned.learner_version:
                continue
            batch = contribution.rollouts
            copied = Sampled(contribution.header.behaviour_version, work.nonce, [],
                             rollouts_from_payload(batch, work.tokenizer.eos_token_id),
                             torch.from_numpy(batch.rewards.astype(np.float32)))
            values = {shard: g.values for shard, g in contribution.gradients.items()}
            return package(work.spec, work.task, work.who, work.learner_state, copied,
                           Learned(learned.learner_version, values, 0.0))
        return super().sign(work, sampled, learned)  # nothing to copy yet: honest work


# ---------------------------------------------------------------------------------- signatures


class ForeignSignature(Behavior):
    """Signs with an Ed25519 key that is not the one staked (and names that key in the header)."""

    name = "foreign-signature"

    def sign(self, work, sampled, learned):
        from nacl.signing import SigningKey

        from krill.protocol.work import package

        foreign = SigningKey(hashlib.sha256(f"foreign/{work.who.worker.lower()}".encode()).digest())
        return package(work.spec, work.task, replace(work.who, signing_key=foreign), work.learner_state, sampled,
                       learned)


class ForgedSignature(Behavior):
    """Names the staked key but carries a signature that does not verify (made over other bytes)."""

    name = "forged-signature"

    def sign(self, work, sampled, learned):
        header, files = super().sign(work, sampled, learned)
        bogus = work.who.signing_key.sign(b"not this header").signature.hex()
        return header.model_copy(update={"signature": bogus}), files


# ---------------------------------------------------------------------------------- versions


class FutureVersion(Behavior):
    """Commits its work under a version that is not published yet."""

    name = "future-version"

    def commit_version(self, work, version, latest):
        return latest + 1


class TooStaleVersion(Behavior):
    """Commits its work under a version older than the run's staleness bound allows."""

    name = "too-stale-version"

    def commit_version(self, work, version, latest):
        return max(0, latest - work.spec.staleness.max_staleness - 1)


# ---------------------------------------------------------------------------------- availability


class Withhold(Behavior):
    """Commits the digest and never uploads the payload."""

    name = "withhold"
    uploads = False


BEHAVIORS: dict[str, type[Behavior]] = {cls.name: cls for cls in (
    Honest, ForgeRewards, FabricateRollouts, Lazy, CherryPick, StaleBehaviour,
    SignFlip, Scale, Noise, Alie, Ipm, Mimic, Copycat, ForeignSignature, ForgedSignature,
    FutureVersion, TooStaleVersion, Withhold)}
GRADIENT_BEHAVIORS = tuple(n for n, cls in BEHAVIORS.items() if issubclass(cls, GradientAttack))


def check_registry(names, listed=WORKER_BEHAVIORS) -> None:
    """Refuse a registry whose names differ from those the core's `worker.behavior` admits
    (`krill.config.WORKER_BEHAVIORS`): a strategy missing there could not be configured, and a name
    there without a strategy would pass validation and fail at start. Checked at import."""
    if set(names) != set(listed):
        missing, extra = sorted(set(listed) - set(names)), sorted(set(names) - set(listed))
        raise RuntimeError(f"worker strategies and krill.config.WORKER_BEHAVIORS differ: not in the registry "
                           f"{missing}, not in WORKER_BEHAVIORS {extra}")


check_registry(BEHAVIORS)


def get_behavior(name: str) -> Behavior:
    try:
        return BEHAVIORS[name]()
    except KeyError:
        raise ConfigError(f"worker.behavior: unknown strategy {name!r}; choose one of {sorted(BEHAVIORS)}") from None
