"""The model card (README.md) of a release: evals, provenance, contributors, hyper-parameters.

Design decisions:
- Pure text from the release's facts, with fixed number formats and no dates or host names, so
  the same facts give the same bytes (the release's CID depends on them).
- YAML front matter marks it a transformers text-generation model; the body is GitHub markdown
  tables a person reads and a script can parse.
- Provenance is everything needed to check the release from public data alone: chain id and
  contract, run id and run-spec CID, manifest CIDs of base and version, the aggregation record
  of every version; the card ends with the `krill audit` line that re-derives the weights.
- What the release's own audit found (`krill.release.lineage`) is stated from its facts only: the
  versions recomputed and the number of checks they passed, and, for a release made with
  `--audit-last N` (earlier versions not recomputed) or `--unaudited` (none), a warning under the
  title and in the provenance naming the versions nobody checked.
"""

from __future__ import annotations

TOKEN = 10**18


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _tokens(amount: int) -> str:
    whole, frac = divmod(amount, TOKEN)
    return f"{whole}.{frac * 10_000 // TOKEN:04d}"


def _flat(prefix: str, value) -> list[tuple[str, str]]:
    if isinstance(value, dict):
        return [row for k in sorted(value) for row in _flat(f"{prefix}.{k}" if prefix else k, value[k])]
    return [(prefix, "–" if value is None else str(value))]


def hyperparameters(spec) -> list[tuple[str, str]]:
    """The run spec's training parameters as (dotted name, value) rows."""
    data = spec.model_dump(mode="json")
    rows = [(k, str(data[k])) for k in ("task", "num_shards", "engine", "seed")]
    for section in ("rollout", "version", "loss", "compression", "rule", "optimizer", "staleness", "trust"):
        rows += _flat(section, data[section])
    rows.append(("chain.max_staleness", str(spec.chain.max_staleness)))
    rows.append(("chain.check_probability_ppm", str(spec.chain.check_probability_ppm)))
    rows.append(("chain.reward_per_version", _tokens(spec.chain.reward_per_version) + " KRILL"))
    return rows


def _unchecked(audit: dict) -> str | None:
    """"1..n" of the lineage versions the release's audit did not recompute, if any (partial audits only)."""
    skipped = audit.get("not_audited") or []
    return f"{skipped[0]}..{skipped[1]}" if audit["audited"] and skipped else None


def _banner(version: int, audit: dict) -> list[str]:
    if not audit["audited"]:
        return [f"> **Not audited**: versions 1..{version} were not checked with `krill audit` when this release "
                "was made (see Provenance).", ""]
    if _unchecked(audit):
        first, last = audit["versions"]
        return [f"> **Partly audited**: only versions {first}..{last} were checked with `krill audit` when this "
                f"release was made; versions {_unchecked(audit)} were not (see Provenance).", ""]
    return []


def _audit_lines(version: int, audit: dict) -> list[str]:
    if not audit["audited"]:
        return [f"**Not audited.** This release was made with `--unaudited`: nobody checked, when it was made, "
                f"that versions 1..{version} are the folds of their parents and aggregation records. Audit them "
                "before trusting the weights:"]
    if not audit["versions"]:
        return ["Version 0 is the run's base model, named by the run's on-chain genesis digest: there is no fold to "
                "audit. Recompute and check later versions from public data:"]
    first, last = audit["versions"]
    if _unchecked(audit):
        return [f"Audited in part (`--audit-last`): before this release was made, `krill audit` recomputed versions "
                f"{first}..{last} from public data (chain and store), each from its published parent, and all "
                f"{audit['checks']} checks passed. Versions {_unchecked(audit)} were **not** audited, and a tampered "
                "one among them would taint this release. Audit them before trusting the weights:"]
    return [f"Audited: before this release was made, `krill audit` recomputed versions {first}..{last} from public "
            f"data (chain and store) and all {audit['checks']} checks passed. Check it again:"]


def render_card(*, spec, version: int, evals: dict, provenance: dict, audit: dict, contributors: list,
                folder: str) -> str:
    base, new = evals["base"], evals["version"]
    k = new["k"]
    lines = ["---", "library_name: transformers", "pipeline_tag: text-generation",
             "tags: [krill, reinforcement-learning, grpo, decentralized-training]", "---", "",
             f"# {spec.name}, version {version}", "",
             *_banner(version, audit),
             f"Post-trained with reinforcement learning by Krill on untrusted hardware: workers sampled rollouts "
             f"and per-shard policy gradients, verifiers replayed a random sample, and a coordinator folded the "
             f"contributions robustly ({spec.rule.type}) into {version} published version(s) of the "
             f"{spec.num_shards}-shard base model. Every step is anchored on chain {provenance['chain_id']}.", "",
             "## Evaluation", "",
             f"Task `{spec.task}`, eval split (held out from training), first {new['n']} prompts; greedy accuracy, "
             f"pass@{k} (temperature 1, seed {evals['seed']}) and mean completion length in tokens.", "",
             f"| model | greedy accuracy | pass@{k} | mean length |", "|---|---:|---:|---:|"]
    for label, r in (("base (version 0)", base), (f"version {version}", new)):
        lines.append(f"| {label} | {_pct(r['accuracy'])} | {_pct(r['pass_at_k'])} | {r['mean_length']:.2f} |")
    delta = 100 * (new["accuracy"] - base["accuracy"])
    lines += ["", f"Change in greedy accuracy: {delta:+.1f} points.", "", "## Provenance", "",
              "| item | value |", "|---|---|"]
    for key in ("chain_id", "contract", "run_id", "run_spec_cid", "base_manifest_cid", "manifest_cid",
                "manifest_digest", "published_block"):
        lines.append(f"| {key.replace('_', ' ')} | `{provenance[key]}` |")
    for v, cid in sorted((int(v), c) for v, c in provenance["record_cids"].items()):
        lines.append(f"| aggregation record v{v} | `{cid}` |")
    lines += ["", *_audit_lines(version, audit), "", "```",
              f"krill --set run.id={provenance['run_id']} --set chain.protocol_address={provenance['contract']} "
              f"audit --all", "```", "", "## Contributors", "",
              "Accepted and rejected contributions from the aggregation records of versions "
              f"1..{version}; rewards are the chain's `RewardCredited` events of this run.", "",
              "| worker | accepted | rejected | total weight | tokens | rewards (KRILL) | reward share |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for c in contributors:
        lines.append(f"| `{c.address}` | {c.accepted} | {c.rejected} | {c.weight:.4f} | {c.tokens} | "
                     f"{_tokens(c.rewards)} | {100 * c.share:.2f}% |")
    if not contributors:
        lines.append("| (none) | 0 | 0 | 0 | 0 | 0 | 0% |")
    lines += ["", "## Training hyper-parameters", "", "| parameter | value |", "|---|---|"]
    lines += [f"| {name} | `{value}` |" for name, value in hyperparameters(spec)]
    lines += ["", "## Files", "",
              f"A plain Hugging Face model directory (`{folder}/`): `config.json`, `model.safetensors`, the "
              "tokenizer files, this card, and `krill-release.json` (the same facts, machine-readable). Load it "
              "with `AutoModelForCausalLM.from_pretrained(path)` and `AutoTokenizer.from_pretrained(path)`.", ""]
    return "\n".join(lines)
