"""A small valid contribution, built deterministically, for the payload tests."""

import numpy as np
from nacl.signing import SigningKey

from krill.payload import ExpectedContext, GradientShard, PayloadLimits, RolloutBatch, build_contribution
from krill.store.cid import file_cid

VOCAB = 64
LIMITS = PayloadLimits(vocab_size=VOCAB, max_rollout_bytes=1 << 20, max_grad_bytes=1 << 20, max_tokens=1 << 14,
                       max_sequences=256, max_sequence_length=128)
GRAD_LENGTHS = {0: {"model.embed_tokens.weight": 40, "model.layers.0.mlp.up_proj.weight": 300},
                1: {"lm_head.weight": 70, "model.norm.weight": 5}}
KEY = SigningKey(bytes(range(32)))


def make_rollouts(rng: np.random.Generator, n: int = 8, prompt: int = 4, completion: int = 5) -> RolloutBatch:
    sequences = []
    for _ in range(n):
        p = rng.integers(0, VOCAB, prompt).tolist()
        c = rng.integers(0, VOCAB, completion).tolist()
        lp = (-rng.random(completion) * 3).astype(np.float32).tolist()
        sequences.append((p, c, lp))
    return RolloutBatch.from_sequences(sequences, rewards=rng.integers(0, 2, n).tolist(),
                                       group_ids=[i // 4 for i in range(n)])


def make_gradients(rng: np.random.Generator, codec: str = "fp16") -> list[GradientShard]:
    return [GradientShard(shard, codec, {name: rng.normal(size=k).astype(np.float32) for name, k in lengths.items()},
                          block_size=32)
            for shard, lengths in GRAD_LENGTHS.items()]


def header_body(key: SigningKey = KEY) -> dict:
    return dict(run_id="5e" * 32, chain_id=31337, contract="0x" + "ab" * 20, worker="0x" + "cd" * 20,
                ed25519_key=bytes(key.verify_key).hex(), model_version=7, behaviour_version=6, manifest_cid=file_cid(b"manifest v7"),
                task="arith", prompt_seed=123456789, nonce=3,
                sampling={"temperature_milli": 1000, "top_p_milli": 1000, "top_k": 0, "max_new_tokens": 5, "seed": 42})


def context(key: SigningKey = KEY, **overrides) -> ExpectedContext:
    body = header_body(key)
    fields = {k: body[k] for k in ("run_id", "chain_id", "contract", "worker", "ed25519_key", "model_version",
                                   "manifest_cid")}
    return ExpectedContext(**{**fields, **overrides})


def make_contribution(seed: int = 0, codec: str = "fp16"):
    rng = np.random.default_rng(seed)
    return build_contribution(header_body(), make_rollouts(rng), make_gradients(rng, codec), KEY, LIMITS)
