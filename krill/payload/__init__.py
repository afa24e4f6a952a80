"""Signed, content-addressed payloads (DESIGN §3): header, rollouts, gradient shards, validation.

Public API: `HeaderBody` / `SignedHeader` / `decode_header` (header.py), `RolloutBatch` /
`decode_rollouts` (rollout.py), `GradientShard` / `decode_gradient_shard` (gradient.py),
`build_contribution` / `validate_contribution` (contribution.py), `PayloadLimits` (limits.py) and
the `PayloadError` subclasses (errors.py).
"""

from krill.payload.contribution import (
    Contribution,
    ExpectedContext,
    build_contribution,
    check_file,
    file_ref,
    validate_contribution,
)
from krill.payload.errors import *  # noqa: F403 - the error classes are part of the API
from krill.payload.gradient import CODECS, GradientShard, decode_gradient_shard
from krill.payload.header import (
    PROTOCOL_VERSION,
    ROLLOUTS_FILE,
    FileRef,
    HeaderBody,
    SamplingParams,
    SignedHeader,
    decode_header,
    grad_file,
)
from krill.payload.limits import PayloadLimits
from krill.payload.rollout import RolloutBatch, decode_rollouts

__all__ = [
    "CODECS", "PROTOCOL_VERSION", "ROLLOUTS_FILE", "Contribution", "ExpectedContext", "FileRef", "GradientShard",
    "HeaderBody", "PayloadLimits", "RolloutBatch", "SamplingParams", "SignedHeader", "build_contribution",
    "check_file", "decode_gradient_shard", "decode_header", "decode_rollouts", "file_ref", "grad_file",
    "validate_contribution",
]
