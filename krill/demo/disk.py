"""Disk space a `krill demo` will take, checked before anything starts.

Design decisions:
- The store keeps every version, as an audit needs it: each version publishes the full fp32
  weights of every shard, every `optimizer_state_every`-th version (default 10) the AdamW states
  (two more tensors per parameter), and each honest worker's contribution adds rollouts and int8
  gradient values on a quarter of the parameters. The default demo of 2026-12-06 05:04 UTC wrote
  2.45 GB of blocks for 400 versions of a 4.2 MB model: 1.45 times the weights per version (3.24
  when it stored the states at every version). The estimate is `OTHER_BYTES_PER_WEIGHT_BYTE` +
  2 / `optimizer_state_every` times the model's weight files per version, for the version budget
  (an upper bound: a demo that runs out of minutes first writes less).
- A dense start (`compression.dense_versions` in the spec overrides) sends every coordinate for its
  first versions: each worker's gradient values then cover all the parameters instead of the
  spec's density, so each such version adds workers x (1 - density) x the value bytes per
  parameter (1 for int8, 2 for fp16/bf16) x the parameter count, which the estimate counts for
  the dense versions within the budget (every worker, attackers included: they commit until
  jailed).
- A demo that would fill the disk stops before it starts, with the figures and what to do (a
  smaller `--versions`, another `--workdir`, or deleting earlier demos, whose sizes it lists):
  an Anvil node, a coordinator and five role processes failing on a full disk mid-run leave
  nothing usable.
- Earlier demos are only listed, never deleted: they are the user's data.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from krill.errors import ConfigError

OTHER_BYTES_PER_WEIGHT_BYTE = 1.35  # per version: weights, contributions, masks (1.25 measured), rounded up
STATE_BYTES_PER_WEIGHT_BYTE = 2.0  # per version that stores the AdamW states (two fp32 moments)
HEADROOM = 1.1


def weight_bytes(model_dir: Path) -> int:
    """Bytes of a model directory's safetensors weights (fp32 as the demo trains them)."""
    return sum(p.stat().st_size for p in Path(model_dir).glob("*.safetensors"))


def store_bytes_per_weight_byte(optimizer_state_every: int) -> float:
    """Store bytes a version writes per byte of the model's weights."""
    return OTHER_BYTES_PER_WEIGHT_BYTE + STATE_BYTES_PER_WEIGHT_BYTE / optimizer_state_every


@dataclass(frozen=True)
class DenseStart:
    """The run's dense start, as the disk estimate needs it."""

    versions: int  # compression.dense_versions
    density: float  # compression.density: the share the sparse versions send
    value_bytes: int  # bytes per sent value: 1 (int8) or 2 (fp16, bf16)
    workers: int  # worker processes committing

    @classmethod
    def of(cls, compression, workers: int) -> DenseStart:
        """From a `CompressionConfig` and the demo's worker count."""
        return cls(compression.dense_versions, compression.density, 1 if compression.dtype == "int8" else 2, workers)

    def within(self, versions: int) -> int:
        """How many of a budget of `versions` versions are dense."""
        return min(self.versions, versions)

    def bytes_per_weight_byte(self) -> float:
        """Extra store bytes a dense version writes per byte of fp32 weights (4 bytes a parameter)."""
        return self.workers * (1.0 - self.density) * self.value_bytes / 4.0


def estimated_bytes(model_dir: Path, versions: int, optimizer_state_every: int, dense: DenseStart | None = None) -> int:
    """What a demo of `versions` versions of `model_dir` writes, at most (store plus 5% for the rest)."""
    per_weight_byte = store_bytes_per_weight_byte(optimizer_state_every) * versions
    if dense is not None:
        per_weight_byte += dense.bytes_per_weight_byte() * dense.within(versions)
    return int(1.05 * per_weight_byte * weight_bytes(model_dir))


def tree_bytes(path: Path) -> int:
    """Bytes of the regular files under `path` (0 when it does not exist)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def earlier_demos(parent: Path, current: Path) -> list[tuple[Path, int]]:
    """(directory, bytes) of the demo work directories next to `current`, oldest first."""
    if not parent.is_dir():
        return []
    return [(d, tree_bytes(d)) for d in sorted(parent.iterdir()) if d.is_dir() and d.resolve() != current.resolve()]


def gigabytes(n: int) -> str:
    return f"{n / 1e9:.1f} GB"


def check_space(workdir: Path, model_dir: Path, versions: int, optimizer_state_every: int,
                earlier: list[tuple[Path, int]] | None = None, dense: DenseStart | None = None) -> int:
    """The estimated bytes; raises ConfigError when the disk under `workdir` has less free than that."""
    need = estimated_bytes(model_dir, versions, optimizer_state_every, dense)
    probe = workdir
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < HEADROOM * need:
        hint = ""
        if earlier:
            hint = (f"; {len(earlier)} earlier demo(s) under {earlier[0][0].parent} take "
                    f"{gigabytes(sum(b for _, b in earlier))}: " + ", ".join(f"{d.name} {gigabytes(b)}" for d, b in earlier))
        raise ConfigError(f"krill demo needs about {gigabytes(need)} in {workdir} ({versions} versions of a "
                          f"{weight_bytes(model_dir) / 1e6:.1f} MB model: the store keeps "
                          f"{store_contents(optimizer_state_every, dense, versions)}) and {probe} has {gigabytes(free)} free; pass a smaller --versions, another "
                          f"--workdir, or free space{hint}")
    return need


def store_contents(optimizer_state_every: int, dense: DenseStart | None, versions: int) -> str:
    """What the estimate counts, in words: the printed estimate and the refusal both say it."""
    n = 0 if dense is None else dense.within(versions)
    text = f"each version's weights, and the AdamW states every {optimizer_state_every} versions"
    return text + (f"; every coordinate of every gradient for the first {n}" if n else "")
