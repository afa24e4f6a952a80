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
- The spec file is checked before anything else happens (`check_spec`: every field but those that
  follow from the published model, which stand in as placeholders), so a typo fails at once, not
  after the password prompt and the model upload. Its errors are one line naming the file and each
  key as the TOML spells it (`krill.config.validation_errors`, shared with the configuration's).
- A create-run whose `createRun` or `fundRewards` receipt did not come in time stops with
  `ReceiptTimeout`, and the transaction may land after it. Run again with the same spec and model
  (the same run id), `createRun` reverts `RunAlreadyExists`, which stopped every rerun: the run stood
  on the chain unfunded, with its id unsaved, and no command funded it. So that revert resumes the
  creation (funds the run, saves its id) when the run is this account's and has neither a reward
  pool nor a version; while any transaction of the account is pending (the first `createRun`,
  `approve` or `fundRewards` itself) the rerun stops with `CreationPending` and funds nothing, so a
  pending funding is never doubled. A run that is funded, has versions or is another account's is
  refused as before.
- The run id is saved as soon as the run is on the chain (created or resumed), before the funding:
  a create-run cut while its `fundRewards` was pending left the id of the run before it in `run-id`
  (which `krill coordinator run` serves), and the rerun, refused once the funding landed, saved
  nothing either, so no command named the run just created and funded.
"""

from __future__ import annotations

import hashlib
import json
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from krill.errors import ChainError, ConfigError

TOKEN = 10**18
DEFAULT_FUNDED_VERSIONS = 100


class CreationPending(ChainError):
    """A transaction of the creating account is pending (a create-run whose receipt did not come in time):
    run create-run again once it is mined."""


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


def _validated(data: dict, source: str, name_flag: str | None):
    from pydantic import ValidationError

    from krill.config import describe_errors, validation_errors
    from krill.protocol.spec import RunSpec

    try:
        return RunSpec.model_validate(data)
    except ValidationError as exc:
        errors = validation_errors(exc, RunSpec)
        if name_flag is not None and any(key == ("name",) for key, _ in errors):  # --name, not the file
            raise ConfigError(f"--name {name_flag!r}: {describe_errors([e for e in errors if e[0] == ('name',)])}") \
                from None
        raise ConfigError(f"{source}: {describe_errors(errors)}") from None


def _spec_data(name: str, num_shards: int, overrides: dict[str, Any] | None, source: str) -> dict:
    """The spec's fields from the file and the flags, less what the published model gives."""
    data = _merge({}, overrides or {})
    for key in ("base_manifest_cid", "format", "num_shards"):
        if key in data:
            raise ConfigError(f"{source}: {key} is set by create-run" + (" (--shards)" if key == "num_shards" else "")
                              + ", remove it")
    data.setdefault("name", name)
    data["num_shards"] = num_shards
    return data


def check_spec(overrides: dict[str, Any] | None, *, name: str = "krill-run", num_shards: int = 2,
               source: str = "run spec"):
    """Validate a spec file's tables before anything is published: every key known, every value in
    bounds, the two staleness bounds agreeing. Returns the spec with placeholders for the base model's
    CID and the caps that follow from the model; raises `ConfigError` naming `source` and the keys."""
    from krill.protocol.spec import draft_with_placeholders, staleness_clash

    data = _spec_data(name, num_shards, overrides, source)
    name_flag = None if "name" in (overrides or {}) else name
    spec = _validated(draft_with_placeholders(data), source, name_flag)  # tables that are not tables fail here
    clash = staleness_clash(data)
    if clash:
        raise ConfigError(f"{source}: {clash}")
    return spec


def build_spec(name: str, manifest, manifest_cid: str, num_shards: int, overrides: dict[str, Any] | None = None,
               source: str = "run spec"):
    """The RunSpec of a new run over the published base `manifest`."""
    draft = check_spec(overrides, name=name, num_shards=num_shards, source=source)
    data = _spec_data(name, num_shards, overrides, source)
    chain_s = data.setdefault("chain", {}).get("max_staleness")
    fold_s = data.setdefault("staleness", {}).get("max_staleness")
    bound = chain_s if chain_s is not None else fold_s
    if bound is not None:
        data["chain"]["max_staleness"] = data["staleness"]["max_staleness"] = bound
    elements = sum(math.prod(p.shape) for s in manifest.shards for p in s.parameters)
    rollout = {"rollout": draft.rollout.model_dump()}
    data["limits"] = _merge(default_limits(manifest.architecture, rollout, elements), data.get("limits", {}))
    data["base_manifest_cid"] = manifest_cid
    return _validated(data, source, None if "name" in (overrides or {}) else name)


def read_spec_file(path: str | Path | None) -> dict[str, Any]:
    """A spec file's tables; a file that is missing, unreadable, not UTF-8 or not TOML is one `ConfigError`."""
    if path is None:
        return {}
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"spec file {path} does not exist") from None
    except OSError as exc:  # a folder, no permission, a device that fails reads
        raise ConfigError(f"spec file {path} cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"spec file {path} is not valid TOML: not UTF-8 text ({exc.reason} at byte "
                          f"{exc.start})") from None
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
               overrides: dict[str, Any] | None = None, fund: int | None = None, save: bool = True,
               source: str = "run spec") -> CreatedRun:
    """Publish `model_dir` and its spec, create the run on-chain (caller = coordinator), fund it.

    `source` names where `overrides` came from in errors (the spec file)."""
    from krill.chain.errors import RunAlreadyExists
    from krill.chain.events import RunCreated
    from krill.chain.types import RunParams
    from krill.model.publish import publish_model_dir
    from krill.protocol.spec import publish_spec
    from krill.store.cid import digest_to_cid

    check_spec(overrides, name=name, num_shards=num_shards, source=source)  # before anything is published
    if not chain.has_role(chain.run_admin_role(), chain.sender):
        raise ConfigError(f"{chain.sender} lacks RUN_ADMIN_ROLE on {chain.address}: create runs with the admin "
                          "account (on a devnet, dev account 0) or have it grant the role")
    manifest, manifest_cid = publish_model_dir(store, model_dir, num_shards)
    spec = build_spec(name, manifest, manifest_cid, num_shards, overrides, source)
    run_id = publish_spec(store, spec)
    c = spec.chain
    params = RunParams(coordinator=chain.sender, max_staleness=c.max_staleness, attestation_quorum=c.attestation_quorum,
                       slash_fraction_bps=c.slash_fraction_bps, verifier_bounty_bps=c.verifier_bounty_bps,
                       check_probability_ppm=c.check_probability_ppm, challenge_window_blocks=c.challenge_window_blocks,
                       reward_per_version=c.reward_per_version)
    amount = c.reward_per_version * DEFAULT_FUNDED_VERSIONS if fund is None else fund
    try:
        receipt = chain.create_run(run_id, hashlib.sha256(manifest.canonical_bytes()).digest(), params)
        block = receipt.event(RunCreated).block_number
    except RunAlreadyExists as exc:  # an earlier create-run of this spec: resumed if it was cut (module docstring)
        block = _resume(chain, run_id, exc)
    if save:  # before the funding, which may be cut (module docstring)
        path = saved_run_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(run_id.hex() + "\n")
    if amount > 0:
        chain.approve_stake(amount)
        chain.fund_rewards(run_id, amount)
    return CreatedRun(run_id=run_id.hex(), name=spec.name, base_manifest_cid=manifest_cid,
                      spec_cid=digest_to_cid(run_id), num_shards=num_shards, coordinator=chain.sender.lower(),
                      funded=amount, block_number=block)


def _resume(chain, run_id: bytes, refused: Exception) -> int:
    """The creation block of run `run_id`, which `createRun` `refused` as existing, when it is this
    account's run and has neither a reward pool nor a version (a create-run cut after `createRun`);
    `CreationPending` while a transaction of the account is pending; else `refused` is raised."""
    w3, sender = chain.w3, chain.sender
    pending = w3.eth.get_transaction_count(sender, "pending") - w3.eth.get_transaction_count(sender, "latest")
    run = chain.run_of(run_id)
    if pending > 0 or not run.exists:
        raise CreationPending(f"run {run_id.hex()}: {max(pending, 1)} transaction(s) of {sender} are pending (an "
                              "earlier create-run whose receipt did not come in time?): run create-run again once "
                              "they are mined") from refused
    if run.params.coordinator.lower() != sender.lower() or run.reward_pool != 0 or run.latest_version != 0:
        raise refused
    return run.created_block


def describe(created: CreatedRun) -> str:
    return json.dumps(created.to_json(), sort_keys=True)
