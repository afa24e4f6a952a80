"""The run spec: every off-chain parameter of a training run, content-addressed.

Design decisions:
- A run is defined by one `RunSpec` document. Its bytes (sorted-key compact JSON) are stored as a
  raw block, and the on-chain run id is sha256 of those bytes, so the chain alone locates the
  spec (`digest_to_cid(run_id)`) and nobody can change a run's rules after the fact.
- The spec nests the configs of the parts it fixes (loss, compression, aggregation rule,
  optimizer, staleness, payload caps) rather than copying their fields, so a part's validation
  lives in one place. On-chain parameters (quorum, slash fraction, check probability, challenge
  window, reward per version) live in `chain` and are checked against the contract's run record.
  Their bounds are the contract's own (a quorum of at most `MAX_ATTESTATIONS`, a reward that fits a
  uint256), so a spec create-run checks before publishing anything is one `createRun` accepts; a
  quorum of 33 to 64 passed that check and the transaction then reverted, after the model and the
  spec were published (no published run can name one, so the bound changes no run's meaning).
- Floats in the spec are fine: nobody re-encodes the spec, everyone hashes the stored bytes.
- A new run caps one worker's contributions per version at `MAX_PER_WORKER_DEFAULT`
  (`version.max_per_worker`); a spec published before the option names none and has no cap.
- The aggregation rule's default is `default_rule` (clip-mix-trim clipping to the median of the
  non-zero norms); a clip-mix-trim table that does not name `clip_basis` takes it too, but a
  published spec is read as written: one from before the option names none and meant the plain
  median, which the class default and the encoding keep. The same holds for the rule's
  `reductions` (any rule type): a new run's is `fixed-tree` (the fold's sums over coordinates give
  the same bits on every CPU, so anyone's `krill audit` recomputes a version exactly); a published
  spec that names none meant torch's kernels, which the class default and the encoding keep.
- Two parts have run defaults that differ from their config class's own
  (`krill.rl.run_defaults`: `compression` 25% int8, `optimizer` lr 1.5e-4). A partial table for
  one of them is read over the run default, field by field, so a spec file that names only
  `[compression] dense_versions` keeps the run's 25% mask instead of silently taking the class's
  10%. A published spec names every field, so its meaning does not change.
- Reward ties (`reward.ties`, `krill.protocol.rewards`): a new run's are `hashed` (tied accounts in
  the 64-account cut and the remainders' units ordered afresh on each version by a hash of the run
  id, the version and the address); a published spec that names none meant `address` (lower address
  first, which accounts ground to low addresses win on every version), which the class default and
  the encoding keep (an `address` table is left out), so its bytes, run id and settlements stay.
- A new spec must fit its own rollout shape: payload caps that hold one honest contribution
  (`limits.max_sequences` >= prompts x group size, `limits.max_groups` >= prompts) and a
  `version.min_contributions` of at most `version.contributions` (the count closes a version first,
  so a larger minimum never applies). Otherwise every honest contribution is refused, or the rule is
  meaningless. A published spec is read as written (`decode`): create-run accepted such specs before.
  The check of a spec file before the model is published (`draft_with_placeholders`) stands in for
  the two caps create-run derives from the shape when the file sets none, so a shape over the class
  default (4096 sequences: 64 prompts of 128) is not refused for a cap create-run would not have set.
"""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_serializer, model_validator

from krill.errors import PayloadError
from krill.payload.limits import PayloadLimits
from krill.rl.aggregate import AggregationRule, default_rule, rule_over_run_default
from krill.rl.compression import CompressionConfig
from krill.rl.loss import LossConfig
from krill.rl.optimizer import AdamWConfig
from krill.rl.run_defaults import RUN_DEFAULTS, over_run_default
from krill.rl.staleness import StalenessConfig

SPEC_FORMAT = "krill-run-spec/1"
MAX_SPEC_BYTES = 64 * 1024
TOKEN = 10**18
MAX_ATTESTATIONS = 32  # the contract's: verdicts of one kind it records per commit (and the largest quorum it takes)
UINT256_MAX = (1 << 256) - 1


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RolloutSpec(_Part):
    """What one contribution samples."""

    prompts_per_contribution: int = Field(4, ge=1, le=4096, description="Prompts assigned per contribution.")
    group_size: int = Field(8, ge=2, le=256, description="Samples per prompt (G).")
    temperature_milli: int = Field(1000, ge=1, le=100_000, description="Sampling temperature x 1000.")
    top_p_milli: int = Field(1000, ge=1, le=1000, description="Nucleus mass x 1000 (1000 = off).")
    max_new_tokens: int | None = Field(None, ge=1, le=1 << 16, description="Completion cap; default: the task's.")


class VersionSpec(_Part):
    """When the coordinator closes a version."""

    contributions: int = Field(4, ge=1, le=4096, description="K: close once this many are accepted.")
    deadline_s: float = Field(60.0, gt=0, le=86_400, description="Or once this long has passed with >= min_contributions.")
    min_contributions: int = Field(1, ge=1, le=4096, description="Fewest accepted contributions a version may fold.")
    max_per_worker: int | None = Field(
        None, ge=1, le=4096,
        description="Most contributions of one worker a version folds (the rest wait for the next version), so the "
                    "robust fold's bound on hostile mass holds per staked account, not per contribution. None: no "
                    "cap (specs published before the option; left out of the encoding). New runs: "
                    "`MAX_PER_WORKER_DEFAULT`.")

    @model_serializer(mode="wrap")
    def _omit_no_cap(self, handler):
        """No cap (the only choice before the option existed) is left out of the encoding, so run specs
        published before it keep their bytes, their run id and their meaning."""
        data = handler(self)
        if self.max_per_worker is None:
            data.pop("max_per_worker", None)
        return data


MAX_PER_WORKER_DEFAULT = 2  # a new run's cap: the worker's own default commits per version (`worker.max_per_version`)


def _version_default() -> VersionSpec:
    return VersionSpec(max_per_worker=MAX_PER_WORKER_DEFAULT)


class TrustSpec(_Part):
    """Beta posterior over verdicts; new workers start low."""

    prior_alpha: float = Field(1.0, gt=0, le=1e6, description="Prior passes.")
    prior_beta: float = Field(3.0, gt=0, le=1e6, description="Prior failures (new workers start at alpha/(alpha+beta)).")
    floor: float = Field(0.05, ge=0, lt=1, description="Contributions of workers below this trust are dropped.")


class VerifySpec(_Part):
    """Tolerances of the verifier's replay checks.

    Defaults: the `[verify]` table of the shipped calibration (`krill/protocol/calibration.toml`,
    written by `krill calibrate`: 1,296 honest checks, 10x margin over the worst, with floors).
    """

    logprob_abs_tol: float = Field(2.1e-4, gt=0, le=10, description="Max |behaviour log-prob - replayed| per token.")
    grad_min_cosine: float = Field(0.99909, ge=-1, le=1, description="Min cosine of claimed vs recomputed shard gradient.")
    grad_norm_rel_tol: float = Field(0.012, ge=0, le=10, description="Max relative norm difference of the gradient.")
    exact_resample: bool = Field(True, description="Require the committed tokens to be re-sampled exactly.")


class ChainSpec(_Part):
    """On-chain run parameters (checked against the contract's record of the run)."""

    max_staleness: int = Field(2, ge=0, le=1000, description="S_max, enforced on commit.")
    attestation_quorum: int = Field(1, ge=1, le=MAX_ATTESTATIONS, description="Failing attestations needed to slash.")
    slash_fraction_bps: int = Field(5000, ge=0, le=10_000, description="Share of stake slashed.")
    verifier_bounty_bps: int = Field(2000, ge=0, le=10_000, description="Share of a slash paid to the verifiers.")
    check_probability_ppm: int = Field(250_000, ge=1, le=1_000_000, description="Chance a verifier checks a commit.")
    challenge_window_blocks: int = Field(40, ge=1, le=1_000_000, description="Blocks during which attestations count.")
    reward_per_version: int = Field(10 * TOKEN, ge=0, le=UINT256_MAX,
                                    description="Tokens split among a version's contributors.")


class RewardSpec(_Part):
    """How a version's settlement orders accounts whose weights (or remainders) tie."""

    ties: Literal["address", "hashed"] = Field(
        "address",
        description="`hashed`: by sha256(tag, run id, version, address), a fresh order each version (every new "
                    "run's: `REWARD_TIES_DEFAULT`); `address`: lower address first (specs published before the "
                    "option; left out of the encoding).")


REWARD_TIES_DEFAULT = "hashed"


def _reward_default() -> RewardSpec:
    return RewardSpec(ties=REWARD_TIES_DEFAULT)


class RunSpec(_Part):
    """The whole, immutable definition of a run."""

    format: str = Field(SPEC_FORMAT, pattern=r"^krill-run-spec/1$")
    name: str = Field(pattern=r"^[A-Za-z0-9._-]{1,64}$", description="Human-readable run name.")
    seed: int = Field(0, ge=0, lt=1 << 63, description="Run seed: prompt assignment, sampling seeds and masks follow.")
    task: str = Field("arithmetic", pattern=r"^[a-z0-9_-]{1,32}(:[0-9]{1,3})?$", description="Task (name or name:level).")
    base_manifest_cid: str = Field(min_length=8, max_length=128, description="CID of version 0's manifest.")
    num_shards: int = Field(2, ge=1, le=256, description="Contiguous parameter shards.")
    engine: str = Field("hf-torch", pattern=r"^[A-Za-z0-9._-]{1,64}$", description="Reference rollout engine.")
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    version: VersionSpec = Field(default_factory=_version_default)
    loss: LossConfig = Field(default_factory=LossConfig)
    compression: CompressionConfig = Field(default_factory=lambda: RUN_DEFAULTS["compression"])
    rule: AggregationRule = Field(default_factory=default_rule)
    optimizer: AdamWConfig = Field(default_factory=lambda: RUN_DEFAULTS["optimizer"])
    staleness: StalenessConfig = Field(default_factory=StalenessConfig)
    trust: TrustSpec = Field(default_factory=TrustSpec)
    verify: VerifySpec = Field(default_factory=VerifySpec)
    chain: ChainSpec = Field(default_factory=ChainSpec)
    reward: RewardSpec = Field(default_factory=_reward_default)
    limits: PayloadLimits
    eval_n: int = Field(500, ge=1, le=100_000, description="Held-out prompts per evaluation.")

    @model_validator(mode="before")
    @classmethod
    def _partial_tables_over_run_defaults(cls, data, info: ValidationInfo):
        """A `compression` or `optimizer` table that names some fields keeps the run default's others; a
        clip-mix-trim `rule` table without `clip_basis`, a `rule` table without `reductions`, a
        `version` table without `max_per_worker`, and a missing `reward` table or one without `ties`,
        take the run default's, except in a published spec (`decode`), where their absence means what
        it meant when it was published (the plain median; torch's reductions; no cap; address ties)."""
        if isinstance(data, dict):
            for key in RUN_DEFAULTS:
                if isinstance(data.get(key), dict):
                    data = {**data, key: over_run_default(key, data[key])}
            if (info.context or {}).get("published"):
                if "reward" not in data:
                    data = {**data, "reward": RewardSpec()}
            else:
                if isinstance(data.get("reward"), dict) and "ties" not in data["reward"]:
                    data = {**data, "reward": {**data["reward"], "ties": REWARD_TIES_DEFAULT}}
                if "rule" in data:
                    data = {**data, "rule": rule_over_run_default(data["rule"])}
                if isinstance(data.get("version"), dict) and "max_per_worker" not in data["version"]:
                    data = {**data, "version": {**data["version"], "max_per_worker": MAX_PER_WORKER_DEFAULT}}
        return data

    @model_validator(mode="after")
    def _no_kl_penalty(self) -> RunSpec:
        """No role keeps a reference model, so a KL weight would change the run id and nothing else."""
        if self.loss.kl_coef != 0.0:
            raise ValueError(f"loss.kl_coef {self.loss.kl_coef:g}: the protocol keeps no reference policy, so the "
                             "KL penalty must be 0")
        return self

    @model_validator(mode="after")
    def _learner_temperature_is_the_samplers(self) -> RunSpec:
        """The learner's log-probs must be the sampler's distribution, else the importance ratio is off
        on on-policy data (clipping fires, the gradient is biased) and the verifier's teacher-forced
        comparison fails honest work."""
        sampling = self.rollout.temperature_milli / 1000
        if abs(self.loss.temperature - sampling) > 1e-9:
            raise ValueError(f"loss.temperature {self.loss.temperature:g} must equal the sampling temperature "
                             f"rollout.temperature_milli / 1000 = {sampling:g}")
        return self

    @model_validator(mode="after")
    def _caps_fit_the_rollout_shape(self, info: ValidationInfo) -> RunSpec:
        """A new spec's caps hold one honest contribution and its minimum can apply (a published spec
        is read as written)."""
        if (info.context or {}).get("published"):
            return self
        prompts, group = self.rollout.prompts_per_contribution, self.rollout.group_size
        wrong = []
        if self.limits.max_sequences < prompts * group:
            wrong.append(f"limits.max_sequences {self.limits.max_sequences} is under rollout.prompts_per_contribution "
                         f"x rollout.group_size = {prompts * group}")
        if self.limits.max_groups < prompts:
            wrong.append(f"limits.max_groups {self.limits.max_groups} is under rollout.prompts_per_contribution "
                         f"{prompts}")
        if wrong:
            wrong = ["; ".join(wrong) + ": every honest contribution would be refused"]
        if self.version.min_contributions > self.version.contributions:
            wrong.append(f"version.min_contributions {self.version.min_contributions} is over version.contributions "
                         f"{self.version.contributions}, which close a version first: the minimum never applies")
        if wrong:
            raise ValueError("; ".join(wrong))
        return self

    @model_serializer(mode="wrap")
    def _omit_address_ties(self, handler):
        """Address ties (the only rule before the option existed) are left out of the encoding, so run specs
        published before it keep their bytes, their run id and their settlements."""
        data = handler(self)
        if self.reward == RewardSpec():
            data.pop("reward", None)
        return data

    def encode(self) -> bytes:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":")).encode()

    @cached_property
    def run_id(self) -> bytes:
        """The on-chain run id: sha256 of the encoded spec (cached: the spec is frozen, and every role
        asks for it many times per version)."""
        return hashlib.sha256(self.encode()).digest()

    @property
    def run_seed(self) -> bytes:
        """32 public bytes from which assignment and sampling seeds derive."""
        return hashlib.sha256(b"krill/run-seed/v1" + self.run_id + self.seed.to_bytes(8, "big")).digest()

    @classmethod
    def decode(cls, data: bytes) -> RunSpec:
        if len(data) > MAX_SPEC_BYTES:
            raise PayloadError(f"{len(data)} bytes, over the cap of {MAX_SPEC_BYTES}", field="run_spec")
        try:
            return cls.model_validate_json(data, context={"published": True})
        except ValueError as exc:
            raise PayloadError(f"not a valid run spec: {exc}", field="run_spec") from None


def publish_spec(store, spec: RunSpec) -> bytes:
    """Store the spec as a raw block; returns the run id (its sha256)."""
    from krill.store.cid import digest_to_cid

    data = spec.encode()
    cid = store.put_block(data, pin=True)
    if cid != digest_to_cid(hashlib.sha256(data).digest()):
        raise PayloadError(f"store answered CID {cid} for the run spec", field="run_spec")
    return spec.run_id


def load_spec(store, run_id: bytes) -> RunSpec:
    """Fetch the spec of on-chain run `run_id` and check it hashes to the id."""
    from krill.store.cid import digest_to_cid

    data = store.get(digest_to_cid(run_id), max_bytes=MAX_SPEC_BYTES)
    if hashlib.sha256(data).digest() != run_id:
        raise PayloadError("content does not hash to the run id", field="run_spec")
    spec = RunSpec.decode(data)
    if spec.encode() != data:
        raise PayloadError("run spec is not in canonical form", field="run_spec")
    return spec


# Stand-ins for what only the published base model gives, so a spec file can be checked before the
# model is published (`krill coordinator create-run`, `krill demo --spec`): a CID of the right length
# and a vocabulary size (the payload caps' one field without a default).
PLACEHOLDER_CID = "b" + "a" * 58
PLACEHOLDER_LIMITS = {"vocab_size": 1}


def shape_caps(rollout) -> dict[str, int]:
    """The payload caps a rollout table's shape needs (`max_sequences`: prompts x group size,
    `max_groups`: prompts), as create-run sets them where the spec sets none; {} for a table that does
    not validate (its own errors are reported by the spec's validation)."""
    try:
        shape = RolloutSpec.model_validate(rollout if rollout is not None else {})
    except ValueError:
        return {}
    return {"max_sequences": shape.prompts_per_contribution * shape.group_size,
            "max_groups": shape.prompts_per_contribution}


def draft_with_placeholders(data: dict) -> dict:
    """A spec's tables with the base model's CID and vocabulary standing in, and the caps create-run
    derives from the rollout shape where the spec sets none (`shape_caps`), ready to validate."""
    limits = data.get("limits", {})
    return {**data, "base_manifest_cid": PLACEHOLDER_CID,
            "limits": ({**PLACEHOLDER_LIMITS, **shape_caps(data.get("rollout")), **limits}
                       if isinstance(limits, dict) else limits)}


def staleness_clash(data: dict) -> str | None:
    """The error of a spec whose two staleness bounds (the contract's `chain.max_staleness`, the fold's
    `staleness.max_staleness`) are both given and differ; create-run couples them. None: they agree."""
    chain_s, fold_s = ((data.get(t) or {}).get("max_staleness") for t in ("chain", "staleness"))
    if chain_s is not None and fold_s is not None and chain_s != fold_s:
        return f"chain.max_staleness = {chain_s} and staleness.max_staleness = {fold_s} differ"
    return None
