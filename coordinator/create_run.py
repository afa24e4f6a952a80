"""Create a run: publish the base model and the run spec, `createRun` on-chain, fund its rewards.

Design decisions:
- The spec is the defaults of `RunSpec`, then a TOML file's tables on top (same nesting as the
  spec: `[version] contributions = 8`, `[chain] attestation_quorum = 2`, ...), then the
  command's flags (name, shards). Payload caps follow from the model and the rollout shape
  (vocabulary = the model's embedding rows; sequences, groups, tokens and file sizes from the
  prompts, group size and context length), unless the TOML sets `[limits]` itself.
- The staleness bound exists twice (the contract enforces `chain.max_staleness` on commit; the
  fold weighs by `staleness`): one given alone sets both; two that disagree are an error.
- Run id = sha256(spec bytes); the base digest on-chain = sha256(base manifest bytes); the run's
  coordinator is the caller (who needs RUN_ADMIN_ROLE: the devnet admin, dev account 0, has it).
- The new run id is printed and written to $KRILL_HOME/coordinator/run-id, which `krill
  coordinator run` reads when run.id is not configured.
"""

from __future__ import annotations

import hashlib
import json
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from krill.errors import ConfigError

TOKEN = 10**18
DEFAULT_FUNDED_VERSIONS = 100


def saved_run_path() -> Path:
    from krill.config import krill_home

    return krill_home() / "coordinator" / "run-id"


def saved_run_id() -> str | None:
    path = saved_run_path()
    return path.read_text().strip() if path.is_file() else None


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def default_limits(architecture: dict, spec_data: dict, elements: int) -> dict[str, int]:
    """Payload caps that fit the model and the rollout shape."""
    from krill.protocol.spec import RolloutSpec

    rollout = RolloutSpec(**spec_data.get("rollout", {}))
    sequences = rollout.prompts_per_contribution * rollout.group_size
    length = int(architecture.get("max_position_embeddings") or 8192)
    tokens = sequences * length
    return {"vocab_size": int(architecture["vocab_size"]), "max_sequences": sequences,
            "max_groups": rollout.prompts_per_contribution, "max_sequence_length": max(2, length),
            "max_tokens": tokens, "max_rollout_bytes": max(1024, tokens * 8 + sequences * 16 + 65536),
            "max_grad_bytes": max(1024, elements * 4 + (1 << 20))}


def build_spec(name: str, manifest, manifest_cid: str, num_shards: int, overrides: dict[str, Any] | None = None):
    """The RunSpec of a new run over the published base `manifest`."""
    from krill.protocol.spec import RunSpec

    data = _merge({}, overrides or {})
    for key in ("base_manifest_cid", "format"):
        if key in data:
            raise ConfigError(f"spec file: {key} is set by create-run, remove it")
    chain_s = data.setdefault("chain", {}).get("max_staleness")
    fold_s = data.setdefault("staleness", {}).get("max_staleness")
    if chain_s is not None and fold_s is not None and chain_s != fold_s:
        raise ConfigError(f"spec file: chain.max_staleness = {chain_s} and staleness.max_staleness = {fold_s} differ")
    bound = chain_s if chain_s is not None else fold_s
    if bound is not None:
        data["chain"]["max_staleness"] = data["staleness"]["max_staleness"] = bound
    elements = sum(math.prod(p.shape) for s in manifest.shards for p in s.parameters)
    data["limits"] = _merge(default_limits(manifest.architecture, data, elements), data.get("limits", {}))
    data.setdefault("name", name)
    data["base_manifest_cid"], data["num_shards"] = manifest_cid, num_shards
    try:
        return RunSpec.model_validate(data)
    except ValueError as exc:
        raise ConfigError(f"run spec: {exc}") from None


def read_spec_file(path: str | Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"spec file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"spec file {path} is not valid TOML: {exc}") from None


@dataclass(frozen=True)
class CreatedRun:
    run_id: str
    name: str
    base_manifest_cid: str
    spec_cid: str
    num_shards: int
    coordinator: str
    funded: int
    block_number: int

    def to_json(self) -> dict:
        return {"run_id": self.run_id, "name": self.name, "base_manifest_cid": self.base_manifest_cid,
                "spec_cid": self.spec_cid, "num_shards": self.num_shards, "coordinator": self.coordinator,
                "funded": str(self.funded), "block_number": self.block_number}


def create_run(chain, store, model_dir: str | Path, *, name: str = "krill-run", num_shards: int = 2,
               overrides: dict[str, Any] | None = None, fund: int | None = None, save: bool = True) -> CreatedRun:
    """Publish `model_dir` and its spec, create the run on-chain (caller = coordinator), fund it."""
    from krill.chain.events import RunCreated
    from krill.chain.types import RunParams
    from krill.model.publish import publish_model_dir
    from krill.protocol.spec import publish_spec
    from krill.store.cid import digest_to_cid

    if not chain.has_role(chain.run_admin_role(), chain.sender):
        raise ConfigError(f"{chain.sender} lacks RUN_ADMIN_ROLE on {chain.address}: create runs with the admin "
                          "account (on a devnet, dev account 0) or have it grant the role")
    manifest, manifest_cid = publish_model_dir(store, model_dir, num_shards)
    spec = build_spec(name, manifest, manifest_cid, num_shards, overrides)
    run_id = publish_spec(store, spec)
    c = spec.chain
    params = RunParams(coordinator=chain.sender, max_staleness=c.max_staleness, attestation_quorum=c.attestation_quorum,
                       slash_fraction_bps=c.slash_fraction_bps, verifier_bounty_bps=c.verifier_bounty_bps,
                       check_probability_ppm=c.check_probability_ppm, challenge_window_blocks=c.challenge_window_blocks,
                       reward_per_version=c.reward_per_version)
    receipt = chain.create_run(run_id, hashlib.sha256(manifest.canonical_bytes()).digest(), params)
    block = receipt.event(RunCreated).block_number
    amount = c.reward_per_version * DEFAULT_FUNDED_VERSIONS if fund is None else fund
    if amount > 0:
        chain.approve_stake(amount)
        chain.fund_rewards(run_id, amount)
    if save:
        path = saved_run_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(run_id.hex() + "\n")
    return CreatedRun(run_id=run_id.hex(), name=spec.name, base_manifest_cid=manifest_cid,
                      spec_cid=digest_to_cid(run_id), num_shards=num_shards, coordinator=chain.sender.lower(),
                      funded=amount, block_number=block)


def describe(created: CreatedRun) -> str:
    return json.dumps(created.to_json(), sort_keys=True)
