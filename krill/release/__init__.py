"""`krill release`: one published version as a Hugging Face model directory with a model card.

Design decisions:
- Nothing is evaluated, written or stored before the lineage is audited (`lineage.py`): versions
  1..V must pass `krill audit`, else `ReleaseAuditError` names the first that fails. The weights
  being the ones the chain names proves nothing if the coordinator named tampered ones.
  `audit_last=N` audits only versions max(1, V-N+1)..V, and `unaudited` skips the audit; the
  metadata and card then name the versions nobody checked. An audited release records which
  versions were recomputed and how many checks they passed.
- The weights are the version's shards exactly as the chain names them (`load_chain_version`
  verifies manifest and record against the on-chain digests; `assemble_files` verifies every
  shard), written as one `model.safetensors` plus `config.json` and the tokenizer files.
- The card (`card.py`) carries the eval table base vs version (`krill.model.evaluate`: greedy
  accuracy, pass@k, mean length on the task's held-out split), provenance, contributors and
  their reward shares (`contributors.py`) and the run's hyper-parameters; `krill-release.json`
  carries the same facts for programs.
- The release goes into the store as ONE deterministic tar archive (`archive.py`): running the
  release twice gives the same CID, which anyone can recompute from the directory.
- `out_dir` must be new, empty, or hold only files the release writes (a re-run overwrites them):
  stray weight or index files would change what `from_pretrained` loads.
- Needs only chain + store; no role is imported.

Public API:
    build_release(chain, store, spec, version, out_dir, *, eval_n=None, k=4, seed=0, from_block=0,
                  unaudited=False, audit_last=None, progress=None) -> Release
    release_files(...) -> (folder, files, facts)      everything but writing and storing
    read_archive(data) -> (folder, files)
    ReleaseAuditError                                 an audited version fails the audit (`.version`, `.failed`)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from krill.errors import ConfigError
from krill.release.archive import read_archive, write_archive
from krill.release.lineage import ReleaseAuditError, audit_lineage, first_audited, not_audited

__all__ = ["RELEASE_FORMAT", "Release", "ReleaseAuditError", "build_release", "read_archive", "release_files"]

RELEASE_FORMAT = "krill-release/1"
CARD = "README.md"
FACTS = "krill-release.json"


@dataclass(frozen=True)
class Release:
    cid: str
    out: Path
    folder: str
    version: int
    evals: dict
    facts: dict

    @property
    def audit(self) -> dict:
        return self.facts["audit"]

    def to_dict(self) -> dict:
        return {"cid": self.cid, "out": str(self.out), "version": self.version, "evals": self.evals,
                "audit": self.audit}


def _evaluate(files: dict[str, bytes], task, n: int, k: int, seed: int) -> dict:
    import tempfile

    from krill.model.evaluate import evaluate

    with tempfile.TemporaryDirectory(prefix="krill-release-eval-") as tmp:
        for name, data in files.items():
            (Path(tmp) / name).write_bytes(data)
        return evaluate(tmp, task, n, k=k, seed=seed).to_dict()


def release_files(chain, store, spec, version: int, *, eval_n: int | None = None, k: int = 4, seed: int = 0,
                  from_block: int = 0, unaudited: bool = False, audit_last: int | None = None,
                  progress: Callable | None = None) -> tuple[str, dict[str, bytes], dict]:
    """(archive folder name, file name -> bytes, facts) of the release of `version`. Audits versions
    1..`version` first, or only the last `audit_last` of them (`ReleaseAuditError` at the first
    failure; `progress` as in `audit_lineage`), unless `unaudited`."""
    from krill.model.publish import assemble_files
    from krill.protocol.state import load_chain_version
    from krill.release.card import hyperparameters, render_card
    from krill.release.contributors import contributors, credited_rewards, records_up_to
    from krill.rl.tasks import get_task
    from krill.store.cid import digest_to_cid

    if audit_last is not None and (unaudited or audit_last < 1):
        raise ConfigError(f"audit_last={audit_last}: give a number of versions >= 1, and not with unaudited")
    # Version 0 has no lineage to audit: the (empty) audit runs whatever the flag says.
    audit = not_audited(version) if unaudited and version else \
        audit_lineage(chain, store, spec, version, progress, first=first_audited(version, audit_last),
                      from_block=from_block)
    run_id = spec.run_id
    target = load_chain_version(chain, store, spec, version)
    base = target if version == 0 else load_chain_version(chain, store, spec, 0)
    files = assemble_files(store, target.manifest)
    task, n = get_task(spec.task), eval_n or spec.eval_n
    evals = {"task": spec.task, "n": n, "k": k, "seed": seed,
             "base": _evaluate(assemble_files(store, base.manifest), task, n, k, seed),
             "version": _evaluate(files, task, n, k, seed)}
    records = records_up_to(chain, store, run_id, version)
    people = contributors(records, credited_rewards(chain, run_id, version, from_block))
    info = chain.version_of(run_id, version)
    provenance = {"chain_id": int(chain.w3.eth.chain_id), "contract": chain.address, "run_id": run_id.hex(),
                  "run_spec_cid": digest_to_cid(run_id), "base_manifest_cid": base.manifest_cid,
                  "manifest_cid": target.manifest_cid, "manifest_digest": info.manifest_digest.hex(),
                  "published_block": int(info.published_block),
                  "record_cids": {str(v): cid for v, (cid, _) in sorted(records.items())}}
    folder = f"krill-{spec.name}-v{version}"
    facts = {"format": RELEASE_FORMAT, "name": spec.name, "version": version, "evals": evals,
             "provenance": provenance, "audit": audit.to_dict(), "contributors": [c.to_dict() for c in people],
             "hyperparameters": dict(hyperparameters(spec))}
    files[CARD] = render_card(spec=spec, version=version, evals=evals, provenance=provenance, audit=facts["audit"],
                              contributors=people, folder=folder).encode()
    files[FACTS] = (json.dumps(facts, indent=2, sort_keys=True) + "\n").encode()
    return folder, files, facts


def build_release(chain, store, spec, version: int, out_dir: str | Path, *, eval_n: int | None = None, k: int = 4,
                  seed: int = 0, from_block: int = 0, unaudited: bool = False, audit_last: int | None = None,
                  progress: Callable | None = None) -> Release:
    """Audit versions 1..`version` (the last `audit_last` of them if given; none if `unaudited`), write the
    release of `version` to `out_dir`, add its archive to the store, return its CID. A failed audit writes
    and stores nothing."""
    folder, files, facts = release_files(chain, store, spec, version, eval_n=eval_n, k=k, seed=seed,
                                         from_block=from_block, unaudited=unaudited, audit_last=audit_last,
                                         progress=progress)
    out = Path(out_dir)
    stray = sorted(p.name for p in out.iterdir() if p.name not in files) if out.is_dir() else []
    if stray:
        # Left in place, stray weight or index files would change what `from_pretrained` loads.
        raise ConfigError(f"--out {out}: holds files this release does not write ({', '.join(stray[:5])}); "
                          "choose an empty or new directory")
    out.mkdir(parents=True, exist_ok=True)
    for name, data in sorted(files.items()):
        (out / name).write_bytes(data)
    cid = store.add(write_archive(folder, files), pin=True)
    return Release(cid=cid, out=out, folder=folder, version=version, evals=facts["evals"], facts=facts)
