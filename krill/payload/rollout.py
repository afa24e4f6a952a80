"""The rollout payload: what was sampled, with which behaviour log-probs, and what it earned.

Design decisions:
- Sequences are concatenated into one token stream with `offsets` (N+1 entries, sequence i is
  `token_ids[offsets[i]:offsets[i+1]]`) rather than padded, so bytes scale with real tokens.
  `prompt_lengths[i]` splits prompt from completion; every sequence has at least one completion
  token (the eos, if nothing else).
- `logprobs` is aligned with `token_ids`: the behaviour policy's log-probability of each completion
  token, exactly 0 on prompt positions. One index serves tokens and log-probs, which keeps the
  verifier's comparison a plain slice.
- `group_ids[i]` is the index of sequence i's prompt within the assignment (GRPO groups);
  `rewards[i]` is its reward.
- Fixed dtypes (int32 tokens, groups and prompt lengths; int64 offsets; float32 log-probs and
  rewards) so a verifier never guesses, and strict validation on both encode and decode: a worker
  cannot build a batch its peers would reject.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from krill.payload.errors import (
    NonFiniteError,
    OffsetsError,
    PayloadTooLargeError,
    SchemaError,
    ShapeError,
    UnsupportedVersionError,
    ValueRangeError,
)
from krill.payload.limits import PayloadLimits
from krill.payload.tensors import encode_safetensors, parse_safetensors

FORMAT = "krill-rollouts"
VERSION = "1"
FIELD = "rollouts"
_DTYPES = {"token_ids": "I32", "offsets": "I64", "prompt_lengths": "I32", "logprobs": "F32",
           "rewards": "F32", "group_ids": "I32"}


@dataclass(frozen=True, eq=False)
class RolloutBatch:
    token_ids: np.ndarray
    offsets: np.ndarray
    prompt_lengths: np.ndarray
    logprobs: np.ndarray
    rewards: np.ndarray
    group_ids: np.ndarray

    @classmethod
    def from_sequences(cls, sequences: list[tuple[list[int], list[int], list[float]]], rewards: list[float],
                       group_ids: list[int]) -> RolloutBatch:
        """Build from (prompt ids, completion ids, completion log-probs) per sequence."""
        tokens, logprobs, offsets, prompt_lengths = [], [], [0], []
        for prompt, completion, lps in sequences:
            if len(lps) != len(completion):
                raise ShapeError(f"{len(lps)} log-probs for {len(completion)} completion tokens", field=f"{FIELD}.logprobs")
            tokens += list(prompt) + list(completion)
            logprobs += [0.0] * len(prompt) + list(lps)
            offsets.append(len(tokens))
            prompt_lengths.append(len(prompt))
        return cls(np.asarray(tokens, np.int32), np.asarray(offsets, np.int64), np.asarray(prompt_lengths, np.int32),
                   np.asarray(logprobs, np.float32), np.asarray(rewards, np.float32), np.asarray(group_ids, np.int32))

    @classmethod
    def from_flat(cls, tokens: np.ndarray, offsets: np.ndarray, prompt_lengths: np.ndarray, logprobs: np.ndarray,
                  rewards: np.ndarray, group_ids: np.ndarray) -> RolloutBatch:
        """Build from arrays already in the flat layout (copies in the wire dtypes; prompt log-probs set to 0)."""
        offsets = np.asarray(offsets, np.int64)
        prompt_lengths = np.asarray(prompt_lengths, np.int32)
        if len(offsets) != len(prompt_lengths) + 1 or len(tokens) != len(logprobs) or (
                len(offsets) and offsets[-1] != len(tokens)):
            raise ShapeError(f"{len(tokens)} tokens, {len(logprobs)} log-probs, {len(offsets)} offsets for "
                             f"{len(prompt_lengths)} sequences", field=f"{FIELD}.offsets")
        logprobs = np.array(logprobs, np.float32)  # a copy: prompt positions are zeroed below
        lengths = np.diff(offsets)
        if (lengths < prompt_lengths).any():
            raise ShapeError("a prompt is longer than its sequence", field=f"{FIELD}.prompt_lengths")
        position = np.arange(len(tokens), dtype=np.int64) - np.repeat(offsets[:-1], lengths)
        logprobs[position < np.repeat(prompt_lengths, lengths)] = 0.0
        return cls(np.asarray(tokens, np.int32), offsets.copy(), prompt_lengths.copy(), logprobs,
                   np.array(rewards, np.float32), np.array(group_ids, np.int32))

    @property
    def n_sequences(self) -> int:
        return len(self.rewards)

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    def sequence(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(prompt ids, completion ids, completion log-probs) of sequence i."""
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        split = start + int(self.prompt_lengths[i])
        return self.token_ids[start:split], self.token_ids[split:end], self.logprobs[split:end]

    def encode(self, limits: PayloadLimits) -> bytes:
        validate_rollouts(self, limits)
        tensors = {name: (dtype, getattr(self, name)) for name, dtype in _DTYPES.items()}
        return encode_safetensors(tensors, {"format": FORMAT, "version": VERSION})

    def __eq__(self, other) -> bool:
        return isinstance(other, RolloutBatch) and all(
            np.array_equal(getattr(self, n), getattr(other, n)) for n in _DTYPES)


def decode_rollouts(data: bytes, limits: PayloadLimits) -> RolloutBatch:
    """Parse and validate an untrusted rollouts.safetensors."""
    st = parse_safetensors(data, limits.max_rollout_bytes, limits.max_safetensors_header_bytes, 16, FIELD)
    if st.metadata.get("format") != FORMAT or st.metadata.get("version") != VERSION:
        raise UnsupportedVersionError(f"format {st.metadata.get('format')!r} version {st.metadata.get('version')!r}; "
                                      f"expected {FORMAT} {VERSION}", field=f"{FIELD}.__metadata__")
    extra = set(st.tensors) - set(_DTYPES)
    if extra:
        raise SchemaError(f"unexpected tensors {sorted(extra)[:5]}", field=FIELD)
    batch = RolloutBatch(**{name: st.array(name, dtype) for name, dtype in _DTYPES.items()})
    validate_rollouts(batch, limits)
    return batch


def validate_rollouts(batch: RolloutBatch, limits: PayloadLimits) -> None:
    """Every structural and range check; raises the specific `PayloadError`."""
    for name, dtype in _DTYPES.items():
        array = getattr(batch, name)
        expected = {"I32": np.int32, "I64": np.int64, "F32": np.float32}[dtype]
        if not isinstance(array, np.ndarray) or array.dtype != expected or array.ndim != 1:
            raise SchemaError(f"must be a 1-D {np.dtype(expected).name} array", field=f"{FIELD}.{name}")
    n, t = len(batch.rewards), len(batch.token_ids)
    if n == 0:
        raise ShapeError("no sequences", field=f"{FIELD}.rewards")
    if n > limits.max_sequences:
        raise PayloadTooLargeError(f"{n} sequences, over the cap of {limits.max_sequences}", field=f"{FIELD}.rewards")
    if t > limits.max_tokens:
        raise PayloadTooLargeError(f"{t} tokens, over the cap of {limits.max_tokens}", field=f"{FIELD}.token_ids")
    for name, length in (("prompt_lengths", n), ("group_ids", n), ("offsets", n + 1), ("logprobs", t)):
        if len(getattr(batch, name)) != length:
            raise ShapeError(f"length {len(getattr(batch, name))}, expected {length}", field=f"{FIELD}.{name}")
    offsets = batch.offsets
    if offsets[0] != 0 or offsets[-1] != t:
        raise OffsetsError(f"must start at 0 and end at {t} tokens", field=f"{FIELD}.offsets")
    lengths = np.diff(offsets)
    if (lengths < 2).any():
        raise OffsetsError("every sequence needs a prompt token and a completion token", field=f"{FIELD}.offsets")
    if (lengths > limits.max_sequence_length).any():
        raise PayloadTooLargeError(f"a sequence is longer than {limits.max_sequence_length} tokens",
                                   field=f"{FIELD}.offsets")
    if (batch.prompt_lengths < 1).any() or (batch.prompt_lengths >= lengths).any():
        raise OffsetsError("each prompt length must be in [1, sequence length)", field=f"{FIELD}.prompt_lengths")
    if (batch.token_ids < 0).any() or (batch.token_ids >= limits.vocab_size).any():
        raise ValueRangeError(f"token id outside [0, {limits.vocab_size})", field=f"{FIELD}.token_ids")
    if (batch.group_ids < 0).any() or (batch.group_ids >= limits.max_groups).any():
        raise ValueRangeError(f"group id outside [0, {limits.max_groups})", field=f"{FIELD}.group_ids")
    for name in ("logprobs", "rewards"):
        if not np.isfinite(getattr(batch, name)).all():
            raise NonFiniteError("NaN or infinity", field=f"{FIELD}.{name}")
    if (np.abs(batch.rewards) > limits.max_abs_reward).any():
        raise ValueRangeError(f"reward outside +-{limits.max_abs_reward}", field=f"{FIELD}.rewards")
    completion = np.ones(t, dtype=bool)
    starts = offsets[:-1]
    for start, plen in zip(starts.tolist(), batch.prompt_lengths.tolist(), strict=True):
        completion[start:start + plen] = False
    if (batch.logprobs[~completion] != 0).any():
        raise ValueRangeError("log-probs on prompt positions must be 0", field=f"{FIELD}.logprobs")
    if (batch.logprobs[completion] > 0).any():
        raise ValueRangeError("a log-probability is positive", field=f"{FIELD}.logprobs")
