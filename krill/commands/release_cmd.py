"""`krill release --version V --out DIR`: the HF model directory of a version, its card, its CID.

Design decisions:
- Needs only chain + store access (config: chain, store, run.id). Writes DIR, adds the release
  archive to the store (pinned) and prints its CID; `--json` prints {"cid", "out", "evals", "audit"}.
- First it audits versions 1..V as `krill audit` does (`krill.release.lineage`: all of them, since a
  tampered ancestor taints V; one recompute per version) and refuses, exit 1 and nothing written,
  at the first that fails. One line per audited version goes out as it is done, except with
  `--json`, whose stdout is the JSON alone. `--audit-last N` audits only versions
  max(1, V-N+1)..V (`krill demo` uses it: a full audit of a 400-version demo took minutes), and
  `--unaudited` none; the release's metadata and card then name the versions not audited.
- Evaluation runs on the task's held-out split for base and version; `--eval-n` defaults to the
  run spec's `eval_n`, `--k` sets pass@k (1 skips sampling). Heavy imports stay inside the command.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import click

from krill.commands.context import output_folder


def _audited_line(report, last: int) -> None:
    verdict = f"all {len(report.checks)} checks match" if report.ok else f"{len(report.failures)} MISMATCH"
    click.echo(f"audit version {report.version}/{last}: {verdict}")


@click.command("release")
@click.option("--version", "version", required=True, type=click.IntRange(0, None), help="Published version to release.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              callback=output_folder,
              help="Directory to write the model into (created if missing).")
@click.option("--eval-n", type=click.IntRange(1, 100_000), default=None,
              help="Held-out prompts to evaluate on [default: the run spec's eval_n, 500].")
@click.option("--k", type=click.IntRange(1, 64), default=4, show_default=True, help="Samples per prompt for pass@k.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the pass@k sampler.")
@click.option("--audit-last", "audit_last", type=click.IntRange(1, None), default=None,
              help="Audit only the last N versions, max(1, V-N+1)..V [default: all of 1..V]; the release's metadata "
                   "and card name the earlier versions as not audited.")
@click.option("--unaudited", is_flag=True,
              help="Skip auditing versions 1..V first; the release's metadata and card then say it was not audited.")
@click.option("--json", "as_json", is_flag=True, help="Print {cid, out, evals, audit} as JSON.")
def release(version: int, out_dir: Path, eval_n: int | None, k: int, seed: int, audit_last: int | None,
            unaudited: bool, as_json: bool) -> None:
    """Audit versions 1..V (or the last N), then assemble V as a Hugging Face model directory with a model
    card, store it, print the CID. Refuses when the audit fails."""
    from transformers.utils import logging as hf_logging

    from krill.commands.audit_cmd import open_public_run
    from krill.errors import ConfigError
    from krill.release import build_release

    if unaudited and audit_last is not None:
        raise click.UsageError("give at most one of --audit-last N and --unaudited")
    hf_logging.disable_progress_bar()
    with ExitStack() as stack:
        config, chain, store, spec = open_public_run(stack)
        latest = chain.run_of(spec.run_id).latest_version
        if version > latest:
            raise ConfigError(f"--version {version}: the run's latest published version is {latest}")
        result = build_release(chain, store, spec, version, out_dir, eval_n=eval_n, k=k, seed=seed,
                               from_block=config.chain.deploy_block, unaudited=unaudited, audit_last=audit_last,
                               progress=None if as_json else _audited_line)
    if as_json:
        click.echo(json.dumps({"cid": result.cid, "out": str(result.out), "evals": result.evals,
                               "audit": result.audit}, sort_keys=True))
        return
    audit = result.audit
    if not audit["audited"]:
        click.echo(f"NOT AUDITED (--unaudited): versions 1..{version} were not checked; the card says so")
    elif audit["versions"]:
        first, last = audit["versions"]
        click.echo(f"audited versions {first}..{last}: all {audit['checks']} checks passed")
        if audit["not_audited"]:
            lo, hi = audit["not_audited"]
            click.echo(f"NOT AUDITED (--audit-last {audit_last}): versions {lo}..{hi} were not checked; the card says so")
    for label in ("base", "version"):
        r = result.evals[label]
        name = "base (v0)" if label == "base" else f"version {version}"
        extra = f"  pass@{r['k']} {r['pass_at_k']:.1%}" if r["pass_at_k"] is not None else ""
        click.echo(f"{name:<12} greedy accuracy {r['accuracy']:.1%}{extra}  mean length {r['mean_length']:.2f}")
    click.echo(f"wrote {result.out} ({result.folder})")
    click.echo(result.cid)
