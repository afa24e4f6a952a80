"""Every check of one contribution, as an arbiter runs them on a failing quorum: the coordinator before
it slashes (`coordinator/confirm.py`), and `krill audit` on a slash the coordinator declined.

Design decisions:
- A quorum of failing verdicts proves nothing by itself: any staked verifier may attest on any
  commit. The party that acts on it replays the checks itself, so both the coordinator's decision
  and an auditor's judgement of it rest on the same function of public data.
- The checks, cheapest first, stopping at the first failure: rollout staleness, the assignment
  and the rewards (no model), the re-sample at the behaviour version, then the gradient of every
  shard the contribution carries (not only the one a verifier drew). The payload itself is the
  caller's to fetch and validate, in its own context; a payload that does not validate is a
  failure the caller reports before calling this.
- Tolerances are the verifiers' defaults (`verifier_tolerances(spec, None)`: the looser of the run
  spec's and the shipped calibration table's), so an arbiter fails exactly what an honest verifier
  with the shipped table fails.
- Models are built from `state_of(version)`, the caller's cache of public version states (the
  coordinator's context, the audit's source); a replay is a teacher-forced pass, a re-sample and a
  gradient pass per shard, paid once per commit at quorum.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from krill.protocol.work import CheckOutcome
from krill.rl.staleness import rollout_lag_problem


def arbitrate(spec, task, tokenizer, contribution, state_of: Callable) -> list[CheckOutcome]:
    """The outcomes of `contribution`'s checks in order, up to and including the first that fails."""
    outcomes = []
    for outcome in _checks(spec, task, tokenizer, contribution, state_of):
        outcomes.append(outcome)
        if not outcome.ok:
            break
    return outcomes


def _checks(spec, task, tokenizer, contribution, state_of: Callable) -> Iterator[CheckOutcome]:
    """Each check's outcome, cheapest first; a model is built only when the checks before it passed."""
    from krill.calibration.table import verifier_tolerances
    from krill.protocol.policy import build_model
    from krill.protocol.work import check_assignment, check_gradient, check_resample, check_rewards
    from krill.rl.engine.hf import HFEngine

    header, batch = contribution.header, contribution.rollouts
    lag = rollout_lag_problem(header.model_version, header.behaviour_version, spec.staleness.max_staleness)
    yield CheckOutcome("rollout staleness", lag is None, lag or "within S_max")
    yield check_assignment(spec, task, tokenizer, header, batch)
    yield check_rewards(spec, task, tokenizer, header, batch)
    verify = verifier_tolerances(spec, None)
    behaviour = build_model(state_of(header.behaviour_version))
    engine = HFEngine(behaviour, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
                      version=header.behaviour_version)
    yield check_resample(spec, task, tokenizer, header, batch, engine, verify)
    learner_state = state_of(header.model_version)
    learner = behaviour if header.model_version == header.behaviour_version else build_model(learner_state)
    for shard, grad in sorted(contribution.gradients.items()):
        yield check_gradient(spec, header, batch, grad.values, shard, learner, learner_state, tokenizer.pad_token_id,
                             verify)


def verdict(outcomes: list[CheckOutcome]) -> tuple[bool, str]:
    """(whether a check failed, one line): the failing check, or every check that passed."""
    failed = next((o for o in outcomes if not o.ok), None)
    if failed is not None:
        return True, f"{failed.name}: {failed.detail}"
    return False, "; ".join(f"{o.name}: {o.detail}" for o in outcomes)[:2000]
