"""`krill bench compression`: bytes per contribution and per version against dense fp32, and accuracy.

Design decisions:
- Each setting of the run spec's `compression` (shared-mask density x value codec) trains the
  same run in process (`LocalTrainer`: the protocol's sample / learn / compress / aggregate /
  AdamW code; same base model, seed, prompts, versions and workers), so settings differ only in
  what travels.
- Bytes are the wire format's, not an estimate: a first-version contribution of each setting is
  encoded as the worker would send it (`krill.payload.build_contribution`: header, rollouts and
  one gradient file per shard with the spec's codec), and dense fp32 is the same contribution with
  every coordinate in fp32 (`GradientShard` codec fp32). Per version = submissions per version x
  bytes per contribution (what the coordinator receives). What the coordinator publishes (new
  shard weights, optimizer states) does not depend on gradient compression; `krill bench protocol`
  measures it.
- Every setting starts sparse (`dense_versions` 0, the spec default): dense first versions would
  be the same for every codec and hide the steady-state bytes this compares.
- Accuracy at equal budget, two readings: equal compute (every setting trains V versions) and
  equal bytes (every setting gets the bytes the spec default, int8 on a 25% mask, sends in V
  versions; a denser setting is evaluated at the version where it has sent that much; a sparser
  one has not spent it by V and shows its version-V figure, marked). Greedy accuracy on the same
  held-out prompts; one seed per setting, so gaps of about two standard errors are noise.
- Sizes: `tiny` (CI smoke: a tiny random model, two settings, two versions) and `default` (the
  default base model, six settings, 40 versions of 8 workers: about 5 minutes on 2 idle cores, 22
  measured on a shared, loaded machine).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from krill.bench.report import fmt, machine_line, pyplot, save, started

# (name, density, dtype); the first is the spec default and sets the byte budget.
SETTINGS: tuple[tuple[str, float, str], ...] = (
    ("int8, 25% mask (spec default)", 0.25, "int8"),
    ("fp16, dense", 1.0, "fp16"),
    ("int8, dense", 1.0, "int8"),
    ("fp16, 25% mask", 0.25, "fp16"),
    ("int8, 10% mask", 0.10, "int8"),
    ("int8, 5% mask", 0.05, "int8"),
)
SIZES: dict[str, dict] = {
    "tiny": {"settings": SETTINGS[:2], "versions": 2, "workers": 2, "prompts_per_worker": 2, "group_size": 4,
             "eval_n": 10, "tiny_model": True, "threads": 1},
    "default": {"settings": SETTINGS, "versions": 40, "workers": 8, "prompts_per_worker": 4, "group_size": 8,
                "eval_n": 500, "tiny_model": False, "threads": 0},
}


def _config(s: dict, density: float, dtype: str):
    from krill.rl.compression import CompressionConfig
    from krill.rl.local_train import LocalTrainConfig

    return LocalTrainConfig(workers=s["workers"], prompts_per_worker=s["prompts_per_worker"],
                            group_size=s["group_size"], versions=s["versions"], minutes=None, eval_n=s["eval_n"],
                            eval_every=s["versions"], compression=CompressionConfig(density=density, dtype=dtype))


def wire_bytes(trainer, contribution, masks: dict[str, torch.Tensor]) -> dict[str, int]:
    """Bytes of `contribution` as a worker sends it, with the run's codec and as dense fp32."""
    import numpy as np
    from nacl.signing import SigningKey

    from krill.payload import GradientShard, PayloadLimits, RolloutBatch, build_contribution
    from krill.protocol.work import CODECS
    from krill.rl.compression import decompress_values
    from krill.store.cid import file_cid

    c = trainer.config.compression
    r, g = contribution.rollouts, trainer.config.group_size
    sequences = [(r.sequence(i)[:int(r.prompt_lengths[i])], r.completion(i), r.completion_logprobs(i).tolist())
                 for i in range(len(r))]
    batch = RolloutBatch.from_sequences(sequences, contribution.rewards.tolist(), [i // g for i in range(len(r))])
    key = SigningKey(bytes(range(32)))
    body = dict(run_id="be" * 32, chain_id=31337, contract="0x" + "ab" * 20, worker=contribution.worker.lower(),
                ed25519_key=bytes(key.verify_key).hex(), model_version=1, behaviour_version=1,
                manifest_cid=file_cid(b"manifest"), task="arithmetic", prompt_seed=1, nonce=0,
                sampling={"temperature_milli": 1000, "max_new_tokens": trainer.task.max_new_tokens, "seed": 7})
    limits = PayloadLimits(vocab_size=int(trainer.model.config.vocab_size))
    sent, dense = [], []
    for shard, names in trainer.shards.items():
        values = decompress_values(contribution.gradients[shard], {n: masks[n] for n in names}, c)
        sent.append(GradientShard(shard, CODECS[c.dtype], {n: values[n].numpy() for n in names}, c.block_size))
        dense.append(GradientShard(shard, "fp32", {n: np.zeros(int(trainer.shapes[n].numel()), np.float32)
                                                   for n in names}))
    out = {}
    for label, grads in (("sent", sent), ("dense_fp32", dense)):
        header, files = build_contribution(body, batch, grads, key, limits)
        gradient = sum(len(v) for k, v in files.items() if k.startswith("grad-"))
        out[label] = {"total": len(header.encode()) + sum(len(v) for v in files.values()), "gradients": gradient}
    return out


def train_setting(model_dir: Path, s: dict, name: str, density: float, dtype: str, budget_bytes: float | None,
                  base_accuracy: float, echo: Callable[[str], None]) -> dict:
    """Train one setting for V versions; bytes, and accuracy at the byte budget and at V."""
    from krill.rl.local_train import LocalTrainer

    started_at = time.perf_counter()
    trainer = LocalTrainer(model_dir, _config(s, density, dtype))
    v_budget, acc_budget, sizes = None, None, []
    while trainer.version < s["versions"]:
        masks = trainer.masks()
        contributions = trainer.contributions(masks)
        if trainer.version == 0:
            sizes = [wire_bytes(trainer, x, masks) for x in contributions]
            per_version = s["workers"] * statistics.fmean(x["sent"]["total"] for x in sizes)
            if budget_bytes is not None:
                v_budget = int(budget_bytes // per_version)
                acc_budget = base_accuracy if v_budget == 0 else None
        trainer.step(contributions, masks)
        if v_budget is not None and trainer.version == v_budget and v_budget < s["versions"]:
            acc_budget = trainer.evaluate()
    accuracy = trainer.evaluate()
    sent = statistics.fmean(x["sent"]["total"] for x in sizes)
    grads = statistics.fmean(x["sent"]["gradients"] for x in sizes)
    dense = statistics.fmean(x["dense_fp32"]["total"] for x in sizes)
    dense_grads = statistics.fmean(x["dense_fp32"]["gradients"] for x in sizes)
    row = {"setting": name, "density": density, "dtype": dtype, "bytes_per_contribution": sent,
           "gradient_bytes_per_contribution": grads, "dense_fp32_bytes_per_contribution": dense,
           "dense_fp32_gradient_bytes": dense_grads, "ratio_vs_dense": dense / sent,
           "gradient_ratio_vs_dense": dense_grads / grads,
           "bytes_per_version": s["workers"] * sent, "dense_fp32_bytes_per_version": s["workers"] * dense,
           "accuracy": accuracy, "versions": trainer.version,
           "budget_version": v_budget if v_budget is not None and v_budget < s["versions"] else None,
           "accuracy_at_budget": acc_budget if acc_budget is not None else accuracy,
           "budget_not_spent": v_budget is not None and v_budget > s["versions"],
           "seconds": round(time.perf_counter() - started_at, 1)}
    echo(f"compression {name:30s} {sent / 1024:8.1f} KiB/contribution (x{row['ratio_vs_dense']:.1f} vs dense fp32)  "
         f"acc {accuracy:.3f} at v{trainer.version}" + (f", {acc_budget:.3f} at v{v_budget} (equal bytes)"
                                                         if acc_budget is not None else "") + f"  {row['seconds']:.0f} s")
    return row


def run_compression(size: str = "default", echo: Callable[[str], None] = print) -> dict:
    from types import SimpleNamespace

    from krill.bench.demo_probe import model_dir as find_model
    from krill.bench.robustness_inproc import base_model_figures

    s = SIZES[size]
    result = started(size)
    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    if s["threads"]:
        torch.set_num_threads(s["threads"])
    try:
        with tempfile.TemporaryDirectory(prefix="krill-bench-compression-") as tmp:
            model_dir = find_model("tiny" if s["tiny_model"] else "base", Path(tmp))
            model_name = ("tiny random Llama (hidden 32, 2 layers)" if s["tiny_model"]
                          else f"default base model {model_dir.name}")
            base, params = base_model_figures(model_dir, SimpleNamespace(eval_n=s["eval_n"]))
            echo(f"compression: {model_name}, {params:,} parameters, base accuracy {base:.3f}")
            rows, budget = [], None
            for name, density, dtype in s["settings"]:
                row = train_setting(model_dir, s, name, density, dtype, budget, base, echo)
                if budget is None:
                    budget = row["bytes_per_version"] * s["versions"]
                rows.append(row)
    finally:
        torch.set_num_threads(threads)
    result.update(settings={k: v for k, v in s.items() if k != "settings"} | {"model": model_name, "parameters": params},
                  base_accuracy=base, budget_bytes=budget, rows=rows, seconds=round(time.perf_counter() - t0, 1))
    return result


def markdown(r: dict) -> str:
    s, rows = r["settings"], r["rows"]
    se = 100 * (max(r["base_accuracy"], 0.05) * (1 - max(r["base_accuracy"], 0.05)) / s["eval_n"]) ** 0.5
    lines = [f"# krill bench compression ({r['size']})", "", f"Machine: {machine_line(r)}.", "",
             f"In process (`LocalTrainer`), {s['model']} ({s['parameters']:,} parameters, base accuracy "
             f"{100 * r['base_accuracy']:.1f}% on {s['eval_n']} held-out prompts), {s['workers']} workers x "
             f"{s['prompts_per_worker']} prompts x {s['group_size']} samples per version, {s['versions']} versions, "
             f"seed 0, clip-mix-trim, AdamW. Bytes are the wire format's (header + rollouts + one gradient file per "
             f"shard). The byte budget is what the spec default sends in {s['versions']} versions "
             f"({r['budget_bytes'] / 1e6:,.2f} MB); one run per setting, standard error of one accuracy about "
             f"{se:.1f} points.", "",
             "| setting | KiB per contribution (gradients) | x smaller than dense fp32 (gradients) | MB per version "
             f"({s['workers']} submissions) | accuracy after {s['versions']} versions (equal compute) | "
             "accuracy at the byte budget (version) |", "|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        at = (f"{100 * row['accuracy_at_budget']:.1f}% (v{row['budget_version']})" if row["budget_version"] is not None
              else f"{100 * row['accuracy_at_budget']:.1f}% (v{row['versions']}"
              + (", budget not spent)" if row["budget_not_spent"] else ")"))
        lines.append(f"| {row['setting']} | {row['bytes_per_contribution'] / 1024:,.1f} "
                     f"({row['gradient_bytes_per_contribution'] / 1024:,.1f}) | x{row['ratio_vs_dense']:.1f} "
                     f"(x{row['gradient_ratio_vs_dense']:.1f}) | {row['bytes_per_version'] / 1e6:,.3f} | "
                     f"{100 * row['accuracy']:.1f}% | {at} |")
    d = rows[0]
    lines += [f"| dense fp32 (reference, bytes only) | {d['dense_fp32_bytes_per_contribution'] / 1024:,.1f} "
              f"({d['dense_fp32_gradient_bytes'] / 1024:,.1f}) | x1 | {d['dense_fp32_bytes_per_version'] / 1e6:,.3f} | "
              "- | - |", "", f"Base model: {100 * r['base_accuracy']:.1f}%. Wall time: {fmt(r['seconds'], 0)} s."]
    return "\n".join(lines) + "\n"


def plots(r: dict, stem: Path) -> list[Path]:
    """Bytes per contribution per setting, and accuracy against cumulative bytes received."""
    plt = pyplot()
    rows = r["rows"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.5))
    names = [row["setting"] for row in rows] + ["dense fp32"]
    kib = [row["bytes_per_contribution"] / 1024 for row in rows] + [rows[0]["dense_fp32_bytes_per_contribution"] / 1024]
    a1.barh(names, kib)
    a1.set_xscale("log")
    a1.invert_yaxis()
    a1.set_xlabel("KiB per contribution (wire format)")
    a1.set_title("bytes per contribution")
    for row in rows:
        per = row["bytes_per_version"] / 1e6
        pts = [(per * row["budget_version"], row["accuracy_at_budget"])] if row["budget_version"] else []
        pts.append((per * row["versions"], row["accuracy"]))
        a2.plot([x for x, _ in pts], [100 * y for _, y in pts], marker="o", label=row["setting"])
    a2.axhline(100 * r["base_accuracy"], color="grey", linestyle=":", label="base model")
    a2.axvline(r["budget_bytes"] / 1e6, color="grey", linestyle="--", label="byte budget")
    a2.set_xscale("log")
    from matplotlib.ticker import NullFormatter

    a2.xaxis.set_minor_formatter(NullFormatter())
    a2.set_xlabel("MB received by the coordinator (cumulative)")
    a2.set_ylabel("greedy accuracy (%)")
    a2.set_title("accuracy against bytes")
    a2.legend(fontsize=7)
    return [save(fig, stem.with_suffix(".png"))]
