"""`krill bench store`: content-store throughput, Ed25519 rates and contribution validation time.

Design decisions:
- Figures for the closing note come from one command that anyone can rerun: put/get of a 50 MB
  object through the local store (get includes verifying every block), Ed25519 sign and verify of
  32-byte digests (what headers sign), and the full `validate_contribution` of a typical
  contribution: 64 sequences x 32 tokens of rollouts plus gradients for 2 shards of a ~1M-parameter
  model on a 5% mask (fp16), whose byte size is reported too.
- Inputs are seeded, the store lives in a temporary directory removed afterwards, and each timing
  is the median of a few repeats, so the numbers are comparable between runs on one machine.
- Like every benchmark, it states the machine it ran on (`krill.bench_env.machine_facts`): under
  `machine` in the JSON, and on a line under the table.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time

import click


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_bench(size_mb: int = 50, repeats: int = 3) -> dict:
    import numpy as np
    from nacl.signing import SigningKey

    from krill.bench_env import machine_facts
    from krill.payload import ExpectedContext, GradientShard, PayloadLimits, RolloutBatch, build_contribution
    from krill.payload import validate_contribution as validate
    from krill.store.cid import file_cid
    from krill.store.local import LocalStore

    rng = np.random.default_rng(0)
    results: dict = {}
    data = rng.integers(0, 256, size_mb * 1_000_000, dtype=np.uint8).tobytes()
    with tempfile.TemporaryDirectory(prefix="krill-bench-") as tmp:
        put_times, get_times = [], []
        for i in range(repeats):
            store = LocalStore(f"{tmp}/s{i}")
            start = time.perf_counter()
            cid = store.add(data)
            put_times.append(time.perf_counter() - start)
            start = time.perf_counter()
            out = store.get(cid, max_bytes=len(data))
            get_times.append(time.perf_counter() - start)
            if out != data:
                raise click.ClickException("local store returned different bytes")
    results["store_object_mb"] = size_mb
    results["store_put_mb_s"] = size_mb / statistics.median(put_times)
    results["store_get_verified_mb_s"] = size_mb / statistics.median(get_times)
    results["file_cid_mb_s"] = size_mb / _median_time(lambda: file_cid(data), repeats)

    key = SigningKey(bytes(range(32)))
    digests = [bytes(rng.integers(0, 256, 32, dtype=np.uint8)) for _ in range(2000)]
    signatures = [key.sign(d).signature for d in digests]
    verify_key = key.verify_key
    sign_s = _median_time(lambda: [key.sign(d) for d in digests], repeats)
    verify_s = _median_time(lambda: [verify_key.verify(d, s) for d, s in zip(digests, signatures, strict=True)],
                            repeats)
    results["ed25519_sign_per_s"] = len(digests) / sign_s
    results["ed25519_verify_per_s"] = len(digests) / verify_s

    # A typical contribution: 64 x 32-token sequences; 2 shards of a ~1M-parameter model, 5% mask.
    vocab, n_seq, prompt_len, completion_len = 14, 64, 8, 24
    sequences = [(rng.integers(0, vocab, prompt_len).tolist(), rng.integers(0, vocab, completion_len).tolist(),
                  (-rng.random(completion_len)).tolist()) for _ in range(n_seq)]
    rollouts = RolloutBatch.from_sequences(sequences, rewards=rng.integers(0, 2, n_seq).tolist(),
                                           group_ids=[i // 8 for i in range(n_seq)])
    params_per_shard = 1_050_000 // 4  # a 4-shard split of the default model
    tensors_per_shard = 12
    per_tensor = params_per_shard // tensors_per_shard
    masked = per_tensor // 20  # 5%
    grad_lengths = {s: {f"shard{s}.tensor{t}": masked for t in range(tensors_per_shard)} for s in (0, 1)}
    gradients = [GradientShard(s, "fp16", {n: rng.normal(size=k).astype(np.float32) for n, k in lengths.items()})
                 for s, lengths in grad_lengths.items()]
    limits = PayloadLimits(vocab_size=vocab)
    body = dict(run_id="be" * 32, chain_id=31337, contract="0x" + "ab" * 20, worker="0x" + "cd" * 20,
                ed25519_key=bytes(key.verify_key).hex(), model_version=1, behaviour_version=1, manifest_cid=file_cid(b"manifest"),
                task="arith", prompt_seed=1, nonce=0,
                sampling={"temperature_milli": 1000, "max_new_tokens": completion_len, "seed": 7})
    header, files = build_contribution(body, rollouts, gradients, key, limits)
    header_bytes = header.encode()
    context = ExpectedContext(run_id=body["run_id"], chain_id=31337, contract=body["contract"], worker=body["worker"],
                              ed25519_key=body["ed25519_key"], model_version=1, digest=header.digest)
    results["contribution_bytes"] = len(header_bytes) + sum(len(v) for v in files.values())
    results["contribution_masked_values"] = 2 * tensors_per_shard * masked
    results["build_contribution_ms"] = 1000 * _median_time(
        lambda: build_contribution(body, rollouts, gradients, key, limits), repeats)
    results["validate_contribution_ms"] = 1000 * _median_time(
        lambda: validate(header_bytes, files, limits, context, grad_lengths), max(repeats, 5))
    results["machine"] = machine_facts()
    return results


LABELS = {
    "store_object_mb": ("local store object", "MB"),
    "store_put_mb_s": ("local store put (add)", "MB/s"),
    "store_get_verified_mb_s": ("local store get (verified)", "MB/s"),
    "file_cid_mb_s": ("UnixFS CID computation", "MB/s"),
    "ed25519_sign_per_s": ("Ed25519 sign (32-byte digest)", "/s"),
    "ed25519_verify_per_s": ("Ed25519 verify (32-byte digest)", "/s"),
    "contribution_bytes": ("typical contribution size", "bytes"),
    "contribution_masked_values": ("gradient values sent (2 shards, 5% mask)", "values"),
    "build_contribution_ms": ("build + sign a contribution", "ms"),
    "validate_contribution_ms": ("validate a contribution", "ms"),
}


@click.command("store")
@click.option("--size-mb", default=50, show_default=True, type=click.IntRange(1, 2000),
              help="Size of the object put and read back through the local store.")
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(1, 50), help="Repeats per timing (median).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def store(size_mb: int, repeats: int, as_json: bool) -> None:
    """Measure the content store, Ed25519 and payload validation on this machine."""
    results = run_bench(size_mb, repeats)
    if as_json:
        click.echo(json.dumps(results, indent=2, sort_keys=True))
        return
    from rich.console import Console
    from rich.table import Table

    from krill.bench.report import machine_summary

    table = Table(title="krill bench store")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("unit")
    for name, (label, unit) in LABELS.items():
        value = results[name]
        table.add_row(label, f"{value:,.1f}" if isinstance(value, float) else f"{value:,}", unit)
    console = Console()
    console.print(table)
    console.print(f"Machine: {machine_summary(results['machine'])}", markup=False, soft_wrap=True)
