"""Replay a committed contribution the way a verifier does: validate it, then run every check."""

from __future__ import annotations

from krill.payload.contribution import ExpectedContext, validate_contribution
from krill.payload.header import decode_header
from krill.protocol.policy import build_model, load_tokenizer
from krill.protocol.state import load_chain_version
from krill.protocol.work import check_assignment, check_gradient, check_resample, check_rewards
from krill.rl.engine.hf import HFEngine
from krill.rl.tasks import get_task
from krill.store.cid import digest_to_cid


def replay_commit(chain, store, spec, commit_id: int):
    """(header, {check name: CheckOutcome}) of commit `commit_id`; raises if it does not validate."""
    info = chain.commit_of(commit_id)
    header_bytes = store.get(digest_to_cid(info.header_digest))
    header = decode_header(header_bytes, spec.limits)
    files = {name: store.get(ref.cid) for name, ref in header.files.items()}
    learner = load_chain_version(chain, store, spec, info.version)
    masks = learner.masks()
    lengths = {s: {n: int(masks[n].numel()) for n in learner.manifest.shard_names(s)}
               for s in range(learner.manifest.num_shards)}
    ctx = ExpectedContext(run_id=spec.run_id.hex(), chain_id=chain.w3.eth.chain_id, contract=chain.address,
                          worker=info.worker, ed25519_key=chain.stake_of(info.worker).ed25519_public_key.hex(),
                          model_version=info.version, manifest_cid=learner.manifest_cid, digest=info.header_digest)
    contribution = validate_contribution(header_bytes, files, spec.limits, ctx, lengths)
    task, tok = get_task(spec.task), load_tokenizer(learner)
    behaviour = load_chain_version(chain, store, spec, header.behaviour_version)
    engine = HFEngine(build_model(behaviour), eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                      version=header.behaviour_version)
    checks = [check_assignment(spec, task, tok, header, contribution.rollouts),
              check_rewards(spec, task, tok, header, contribution.rollouts),
              check_resample(spec, task, tok, header, contribution.rollouts, engine)]
    learner_model = build_model(learner)
    for shard, grad in sorted(contribution.gradients.items()):
        outcome = check_gradient(spec, header, contribution.rollouts, grad.values, shard, learner_model, learner,
                                 tok.pad_token_id)
        outcome.name = f"gradient-{shard}"
        checks.append(outcome)
    return header, {c.name: c for c in checks}
