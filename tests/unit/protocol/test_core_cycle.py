"""One version cycle through the protocol core, in process: produce, validate, replay, fold, publish, reload."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from krill.payload.contribution import ExpectedContext, validate_contribution
from krill.protocol.policy import build_model, load_tokenizer
from krill.protocol.record import AcceptedEntry
from krill.protocol.state import load_version
from krill.protocol.step import Submission, fold_version, folded_state, publish_version_content
from krill.protocol.work import (
    check_assignment,
    check_gradient,
    check_resample,
    check_rewards,
    learn,
    package,
    sample,
)
from krill.rl.engine.hf import HFEngine
from krill.rl.tasks import get_task


def _produce(spec, base, who, nonce, tamper=None):
    task, tok = get_task(spec.task), load_tokenizer(base)
    model = build_model(base)
    engine = HFEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, version=base.version)
    sampled = sample(spec, task, tok, engine, who.worker, nonce)
    if tamper == "rewards":
        sampled.rewards = 1.0 - sampled.rewards
    learned = learn(spec, model, base, sampled, [0, 1], tok.pad_token_id)
    return package(spec, task, who, base, sampled, learned)


def _checker(spec, base):
    """(task, tokenizer, engine at `base`): what a replay runs with."""
    task, tok = get_task(spec.task), load_tokenizer(base)
    return task, tok, HFEngine(build_model(base), eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, version=base.version)


def _grad_lengths(base):
    masks = base.masks()
    return {s: {n: int(masks[n].numel()) for n in base.manifest.shard_names(s)} for s in range(base.manifest.num_shards)}


def _validate(spec, base, header, files):
    ctx = ExpectedContext(run_id=spec.run_id.hex(), worker=header.worker, model_version=base.version,
                          manifest_cid=base.manifest_cid, digest=header.digest)
    return validate_contribution(header.encode(), files, spec.limits, ctx, _grad_lengths(base))


def test_produce_validate_and_replay_passes_for_honest_work(tiny_run):
    store, spec, base, workers = tiny_run
    header, files = _produce(spec, base, workers[0], nonce=0)
    contribution = _validate(spec, base, header, files)
    task, tok, engine = _checker(spec, base)
    checks = [check_assignment(spec, task, tok, header, contribution.rollouts),
              check_rewards(spec, task, tok, header, contribution.rollouts),
              check_resample(spec, task, tok, header, contribution.rollouts, engine)]
    for shard in (0, 1):
        checks.append(check_gradient(spec, header, contribution.rollouts, contribution.gradients[shard].values, shard,
                                     build_model(base), base, tok.pad_token_id))
    assert all(c.ok for c in checks), [(c.name, c.detail) for c in checks]
    assert checks[-1].figures["cosine"] > 0.999


def test_forged_rewards_fail_the_reward_check(tiny_run):
    store, spec, base, workers = tiny_run
    header, files = _produce(spec, base, workers[1], nonce=0, tamper="rewards")
    contribution = _validate(spec, base, header, files)
    check = check_rewards(spec, get_task(spec.task), load_tokenizer(base), header, contribution.rollouts)
    assert not check.ok and check.figures["mismatched"] == len(contribution.rollouts.rewards)


@pytest.mark.parametrize("change", [1, -4])
def test_a_batch_of_another_sequence_count_fails_the_reward_check_without_raising(tiny_run, change):
    """The audit runs the rewards check after a failed assignment check: a 17th sequence (one without an
    assigned prompt) raised IndexError there, and the version's audit stopped as an internal failure."""
    from krill.payload.rollout import RolloutBatch

    store, spec, base, workers = tiny_run
    header, files = _produce(spec, base, workers[2], nonce=5)
    batch = _validate(spec, base, header, files).rollouts
    n = batch.n_sequences + change
    picks = [min(i, batch.n_sequences - 1) for i in range(n)]
    sequences = [tuple(list(part) for part in batch.sequence(i)) for i in picks]
    other = RolloutBatch.from_sequences(sequences, batch.rewards[picks].tolist(), batch.group_ids[picks].tolist())
    task, tok = get_task(spec.task), load_tokenizer(base)
    assert not check_assignment(spec, task, tok, header, other).ok
    check = check_rewards(spec, task, tok, header, other)
    assert not check.ok and check.figures == {"sequences": n, "assigned": batch.n_sequences}


def test_fold_publish_reload_is_deterministic_and_moves_weights(tiny_run):
    store, spec, base, workers = tiny_run
    # A random tiny model earns no reward (zero advantages, zero gradients), so the values folded
    # here are seeded random gradients on the public masks: this test is about the step itself.
    rng = np.random.default_rng(0)
    lengths = _grad_lengths(base)
    submissions, accepted = [], []
    for i, who in enumerate(workers[:2]):
        header, files = _produce(spec, base, who, nonce=5)
        c = _validate(spec, base, header, files)
        values = {s: {n: rng.standard_normal(k).astype(np.float32) for n, k in lengths[s].items()} for s in lengths}
        submissions.append(Submission(commit_id=i + 1, weight=0.5, model_version=0, values=values))
        accepted.append(AcceptedEntry(commit_id=i + 1, worker=who.worker, header_digest=header.digest.hex(),
                                      model_version=0, behaviour_version=0, staleness=0, trust="0.5", weight="0.5",
                                      shards=[0, 1], mean_reward=repr(float(c.rollouts.rewards.mean())),
                                      tokens=int(c.rollouts.n_tokens)))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        first = fold_version(spec, base, submissions, {0: base})
        torch.set_num_threads(3)  # an auditor with other settings recomputes the same bits
        second = fold_version(spec, base, list(reversed(submissions)), {0: base})
        assert torch.get_num_threads() == 3  # the caller's setting is put back
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(first, second, strict=True):
        assert a.optimizer_state == b.optimizer_state
        assert all(torch.equal(a.tensors[n], b.tensors[n]) for n in a.tensors)
        assert (repr(a.update_norm), repr(a.grad_norm), a.trimmed_fractions) == \
            (repr(b.update_norm), repr(b.grad_norm), b.trimmed_fractions)
    for r in first:
        moved = [n for n in r.tensors if not torch.equal(r.tensors[n], base.shard_tensors(r.shard)[n])]
        assert len(moved) >= len(r.tensors) - 1, sorted(set(r.tensors) - set(moved))
    content = publish_version_content(store, spec, base, first, accepted, [], "count")
    manifest, record = content.manifest, content.record
    v1 = load_version(store, spec, 1, __import__("hashlib").sha256(manifest.canonical_bytes()).digest(), record.digest)
    assert v1.record == record and v1.optimizer_state(0) == first[0].optimizer_state
    masks0, masks1 = base.masks(), v1.masks()  # v1's: the published blob, equal to what the momentum gives
    assert all(torch.equal(masks1[n], m) for n, m in v1.derived_masks().items())
    assert any(not torch.equal(masks0[n], masks1[n]) for n in masks0)  # momentum now steers the mask
    assert np.allclose(v1.shard_tensors(1)[manifest.shard_names(1)[0]].numpy(),
                       first[1].tensors[manifest.shard_names(1)[0]].numpy())
    # The publisher keeps the version as it folded it (a coordinator's cache): the same as loading it back.
    kept = folded_state(store, spec, base, first, content)
    assert (kept.version, kept.manifest_cid, kept.record_cid) == (1, v1.manifest_cid, v1.record_cid)
    for shard in range(manifest.num_shards):
        assert kept.optimizer_state(shard) == v1.optimizer_state(shard)
        a, b = kept.shard_tensors(shard), v1.shard_tensors(shard)
        assert list(a) == list(b) and all(a[n].dtype == b[n].dtype and torch.equal(a[n], b[n]) for n in a)
    assert all(torch.equal(kept.masks()[n], m) for n, m in masks1.items())


@pytest.mark.parametrize("attack", ["signature", "context"])
def test_forged_or_misdirected_headers_are_rejected(tiny_run, attack):
    from nacl.signing import SigningKey

    from krill.payload.errors import ContextMismatchError, SignatureError
    from krill.protocol.work import Identity

    store, spec, base, workers = tiny_run
    who = workers[2]
    if attack == "signature":
        who = Identity(who.chain_id, who.contract, who.worker, SigningKey(b"\x09" * 32))
        header, files = _produce(spec, base, who, nonce=1)
        with pytest.raises(SignatureError):
            ctx = ExpectedContext(ed25519_key=bytes(workers[2].signing_key.verify_key).hex())
            validate_contribution(header.encode(), files, spec.limits, ctx, _grad_lengths(base))
    else:
        header, files = _produce(spec, base, who, nonce=1)
        with pytest.raises(ContextMismatchError):
            validate_contribution(header.encode(), files, spec.limits, ExpectedContext(run_id="00" * 32),
                                  _grad_lengths(base))


def test_fold_places_each_learner_versions_values_on_its_own_mask(tiny_run):
    """Two submissions computed at learner versions with different masks: each value lands on its
    own coordinate of the union (a stale contribution has zeros where its mask did not reach).
    The values' signs encode their coordinates (+ on even, - on odd), all rules keep the sign of
    rows that agree, and AdamW's first step moves each coordinate against its gradient's sign:
    a value placed on another coordinate shows as a wrong sign or a moved coordinate outside."""
    from krill.protocol.step import fold_shard

    _store, spec, base, _workers = tiny_run
    spec = spec.model_copy(update={"optimizer": spec.optimizer.model_copy(update={"lr": 0.05, "weight_decay": 0.0})})
    names = base.manifest.shard_names(0)
    parent = base.shard_tensors(0)
    rng = np.random.default_rng(1)
    masks: dict[int, dict[str, torch.Tensor]] = {3: {}, 4: {}}
    for n in names:
        numel = parent[n].numel()
        for v in masks:
            masks[v][n] = torch.from_numpy(np.sort(rng.choice(numel, size=max(1, numel // 3), replace=False)))

    def signed(mask):
        return np.where(mask.numpy() % 2 == 0, 1.0, -1.0).astype(np.float32) * rng.uniform(0.5, 2.0, mask.numel())

    subs = [Submission(commit_id=i + 1, weight=0.5, model_version=v, values={0: {n: signed(masks[v][n]) for n in names}})
            for i, v in enumerate(masks)]
    result = fold_shard(spec, 0, names, parent, None, subs, masks)
    for n in names:
        moved = (result.tensors[n].float() - parent[n].float()).reshape(-1)
        union = torch.unique(torch.cat([masks[3][n], masks[4][n]]))
        outside = torch.ones(moved.numel(), dtype=torch.bool)
        outside[union] = False
        assert torch.all(moved[outside] == 0), n
        expected = torch.where(union % 2 == 0, -1.0, 1.0)
        assert torch.equal(torch.sign(moved[union]), expected), n


def test_batched_payload_prompts_and_decoding_equal_the_per_sequence_forms(tiny_run):
    """The batched conversions on every contribution's path give exactly what the per-sequence code gave."""
    from krill.model.tokenizer import decode_completion, decode_completions
    from krill.payload.rollout import RolloutBatch
    from krill.protocol.work import assigned_prompts, group_ids, rollout_payload

    _, spec, base, workers = tiny_run
    task, tok, engine = _checker(spec, base)
    sampled = sample(spec, task, tok, engine, workers[1].worker, 5)
    r = sampled.rollouts
    assert r.completions() == [r.completion(i) for i in range(len(r))]
    assert r.sequences() == [r.sequence(i) for i in range(len(r))]
    texts = decode_completions(tok, r.completions() + [[tok.eos_token_id, 5], []])
    assert texts == [decode_completion(tok, c) for c in r.completions()] + ["", ""]
    # Nonzero log-probs on prompt positions must not reach the wire (the layout says they are 0).
    noisy = type(r)(r.tokens, r.offsets, r.prompt_lengths, r.logprobs + 0.5, r.finished)
    per_sequence = RolloutBatch.from_sequences(
        [(r.sequence(i)[:int(r.prompt_lengths[i])], r.completion(i), noisy.completion_logprobs(i).tolist())
         for i in range(len(r))], sampled.rewards.tolist(), group_ids(spec, len(r)).tolist())
    flat = rollout_payload(spec, noisy, sampled.rewards)
    assert flat == per_sequence and all(getattr(flat, n).dtype == getattr(per_sequence, n).dtype
                                        for n in ("token_ids", "offsets", "prompt_lengths", "logprobs", "rewards"))
    _, prompts, metas = assigned_prompts(spec, task, tok, workers[1].worker, 0, 5)
    assert prompts == [r.sequence(i)[:int(r.prompt_lengths[i])] for i in range(len(r))]
    assert prompts[0] == tok(task.prompts(sampled.prompt_indices, "train")[0][0])["input_ids"]


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
def test_teacher_forced_replay_confirms_honest_draws_and_nothing_else(tiny_run, temperature, top_p):
    """The fast resample confirms exactly what the seed draws; a changed token, another seed or a truncated
    completion is left to the exact re-generation."""
    from krill.rl.engine.base import SamplingParams
    from krill.rl.engine.replay import fast_path_available, replay_draws

    _, spec, base, workers = tiny_run
    assert fast_path_available()
    task, tok, engine = _checker(spec, base)
    prompts = [tok(text)["input_ids"] for text, _ in task.prompts(list(range(40, 46)), "train") for _ in range(4)]
    params = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=task.max_new_tokens)

    def replay(rollouts, seed=11):
        return replay_draws(engine.model, rollouts, params, seed, tok.eos_token_id, tok.pad_token_id, 2.1e-4)

    drawn = engine.generate(prompts, params, 11)
    assert replay(drawn).confirmed, replay(drawn).detail
    if temperature > 0:
        other = engine.generate(prompts, params, 12)
        assert other.sequences() != drawn.sequences()
        assert not replay(other).confirmed  # honest tokens, but not this seed's
    # One completion token changed (log-prob kept): not the seed's draw.
    row = 5
    at = int(drawn.offsets[row] + drawn.prompt_lengths[row])
    tokens = drawn.tokens.clone()
    tokens[at] = (int(tokens[at]) + 1) % 10 + 4
    changed = type(drawn)(tokens, drawn.offsets, drawn.prompt_lengths, drawn.logprobs, drawn.finished)
    assert not replay(changed).confirmed
    # A finished completion cut before its eos is a layout generation cannot produce.
    lengths = drawn.completion_lengths().tolist()
    row = next(i for i in range(len(drawn)) if lengths[i] > 1 and drawn.completion(i)[-1] == tok.eos_token_id)
    last = int(drawn.offsets[row + 1]) - 1
    keep = torch.ones(len(drawn.tokens), dtype=torch.bool)
    keep[last] = False
    ends = drawn.offsets.clone()
    ends[row + 1:] -= 1
    cut = type(drawn)(drawn.tokens[keep], ends, drawn.prompt_lengths, drawn.logprobs[keep], drawn.finished)
    assert not replay(cut).confirmed


def test_check_resample_takes_the_fast_path_for_honest_work_and_fails_forged_tokens(tiny_run):
    from krill.payload.rollout import RolloutBatch

    store, spec, base, workers = tiny_run
    header, files = _produce(spec, base, workers[2], nonce=3)
    contribution = _validate(spec, base, header, files)
    task, tok, engine = _checker(spec, base)
    honest = check_resample(spec, task, tok, header, contribution.rollouts, engine)
    assert honest.ok and honest.figures.get("fast_path") is True
    b = contribution.rollouts
    tokens = b.token_ids.copy()
    at = int(b.offsets[2] + b.prompt_lengths[2])
    tokens[at] = (tokens[at] + 1) % 10 + 4
    forged = RolloutBatch(tokens, b.offsets, b.prompt_lengths, b.logprobs, b.rewards, b.group_ids)
    outcome = check_resample(spec, task, tok, header, forged, engine)
    assert not outcome.ok and "fast_path" not in outcome.figures and outcome.figures["token_mismatches"] == 1


def _random_submissions(spec, state, workers, rng, nonce, weight="0.5"):
    """Seeded random gradients on `state`'s public masks from `workers` (see the test above), as
    Submissions and the record's AcceptedEntries."""
    lengths = _grad_lengths(state)
    submissions, accepted = [], []
    for i, who in enumerate(workers):
        header, files = _produce(spec, state, who, nonce=nonce)
        c = _validate(spec, state, header, files)
        values = {s: {n: rng.standard_normal(k).astype(np.float32) for n, k in lengths[s].items()} for s in lengths}
        commit_id = 10 * nonce + i + 1
        submissions.append(Submission(commit_id=commit_id, weight=float(weight), model_version=state.version,
                                      values=values))
        accepted.append(AcceptedEntry(commit_id=commit_id, worker=who.worker, header_digest=header.digest.hex(),
                                      model_version=state.version, behaviour_version=state.version, staleness=0,
                                      trust=weight, weight=weight, shards=[0, 1],
                                      mean_reward=repr(float(c.rollouts.rewards.mean())), tokens=int(c.rollouts.n_tokens)))
    return submissions, accepted


class _Replay:
    """A FoldReplay over versions held in memory: what the coordinator's context and the audit's
    source do from chain and store."""

    def __init__(self):
        self.states, self.inputs, self.folded = {}, {}, []

    def state(self, version):
        return self.states[version]

    def fold_inputs(self, version, record):
        self.folded.append(version)
        return self.inputs[version]


def test_optimizer_states_not_stored_are_replayed_from_the_folds_and_checked(tiny_run):
    import hashlib

    from krill.errors import ModelError

    store, spec, base, workers = tiny_run
    rng = np.random.default_rng(1)
    replay, kept, parent = _Replay(), {0: base}, base
    replay.states[0] = base
    for version in (1, 2, 3):  # none stores its optimizer states
        submissions, accepted = _random_submissions(spec, parent, workers[:2], rng, nonce=version)
        results = fold_version(spec, parent, submissions, {parent.version: parent})
        content = publish_version_content(store, spec, parent, results, accepted, [], "count", keep_states=False)
        assert all(o.optimizer_state_cid is None and o.optimizer_state_sha256 == hashlib.sha256(r.optimizer_state).hexdigest()
                   for o, r in zip(content.record.shards, results, strict=True))
        assert not any(store.has(p.cid) for p in content.pending_states) and content.pending_states == ()
        kept[version] = parent = folded_state(store, spec, parent, results, content)
        digest = hashlib.sha256(content.manifest.canonical_bytes()).digest()
        replay.inputs[version] = (submissions, {version - 1: replay.states[version - 1]})
        replay.states[version] = load_version(store, spec, version, digest, content.record.digest, replay=replay)

    bare = load_version(store, spec, 3, hashlib.sha256(kept[3].manifest.canonical_bytes()).digest(), kept[3].record.digest)
    assert bare.masks() is not None  # workers read the published masks, which need no states
    with pytest.raises(ModelError, match="not stored"):
        bare.optimizer_state(0)
    loaded = replay.states[3]  # version 3 needs 2, which needs 1, which folds on version 0
    for shard in (0, 1):
        assert loaded.optimizer_state(shard) == kept[3].optimizer_state(shard)
        for version in (1, 2):
            assert replay.states[version].optimizer_state(shard) == kept[version].optimizer_state(shard)
    assert replay.folded == [1, 2, 3]  # each version folded once, oldest first (no recursion per version)
    assert all(torch.equal(kept[3].masks()[n], m) for n, m in loaded.derived_masks().items())

    # A replay fed other inputs than the record's (here another weight for one) cannot reach its sha256.
    forged = _Replay()
    forged.states[0] = base
    submissions, learners = replay.inputs[1]
    first, *rest = submissions  # (equal weights scaled alike would give the same weighted mean)
    forged.inputs[1] = ([Submission(first.commit_id, 0.9, first.model_version, first.values), *rest], learners)
    forged.states[1] = load_version(store, spec, 1, hashlib.sha256(kept[1].manifest.canonical_bytes()).digest(),
                                    kept[1].record.digest, replay=forged)
    with pytest.raises(ModelError, match="replaying version 1's fold gives another optimizer state"):
        forged.states[1].optimizer_state(1)
