"""The run's defaults for the parts whose config class defaults differ, shared by the spec and the local trainer.

Design decisions:
- Two parts have run defaults that differ from their config class's own (`compression`: 25% int8
  against `CompressionConfig`'s 10%; `optimizer`: lr 1.5e-4 against `AdamWConfig`'s 1e-4). A
  protocol run (`krill.protocol.spec.RunSpec`) and the in-process loop (`krill train local`) both
  start from this one table, so the two cannot drift apart.
- It lives in `krill.rl`, beside the config classes, because `krill.protocol` imports `krill.rl`
  and not the other way round.
"""

from __future__ import annotations

from pydantic import BaseModel

from krill.rl.compression import CompressionConfig
from krill.rl.optimizer import AdamWConfig

RUN_DEFAULTS: dict[str, BaseModel] = {"compression": CompressionConfig(density=0.25, dtype="int8"),
                                      "optimizer": AdamWConfig(lr=1.5e-4)}


def over_run_default(key: str, table: dict | None) -> dict:
    """The fields of part `key` (a `RUN_DEFAULTS` key) that a table gives: the run default's, then the table's."""
    return {**RUN_DEFAULTS[key].model_dump(), **(table or {})}
