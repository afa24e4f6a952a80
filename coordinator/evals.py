"""Held-out evaluation of published versions, stored in the `evals` table (the demo and release read it).

Design decisions:
- Greedy accuracy on the first `spec.eval_n` prompts of the task's eval split
  (`krill.model.evaluate`): deterministic, so any party evaluating a version gets the same figure.
- The model is built from the version's state as the coordinator holds it: right after
  publishing, the tensors the fold left in memory, which are the bytes it stored and whose
  digests are on-chain (`publish.complete_version` adopts them only after the transaction);
  after a restart, the version loaded from chain and store. Either way, what is measured is
  what was published; `krill audit` and `krill release` check those bytes against the chain.
- A version already evaluated is not evaluated again (restarts are cheap).
"""

from __future__ import annotations

from krill.db.models import Eval


def evaluated(ctx, version: int) -> float | None:
    with ctx.db.session() as s:
        row = s.get(Eval, (ctx.run_hex, version, ctx.spec.task, "eval"))
        return None if row is None else row.accuracy


def evaluate_version(ctx, version: int) -> float:
    """Greedy eval accuracy of `version` (stored; returned from the table if already there)."""
    from krill.model.evaluate import evaluate
    from krill.protocol.policy import build_model, load_tokenizer
    from krill.rl.tasks import get_task

    known = evaluated(ctx, version)
    if known is not None:
        return known
    state = ctx.state(version)
    result = evaluate(build_model(state), get_task(ctx.spec.task), n=ctx.spec.eval_n, tokenizer=load_tokenizer(state))
    with ctx.db.write() as s:
        if s.get(Eval, (ctx.run_hex, version, ctx.spec.task, "eval")) is None:
            s.add(Eval(run_id=ctx.run_hex, version=version, task=ctx.spec.task, split="eval", n=result.n,
                       correct=round(result.accuracy * result.n), accuracy=result.accuracy))
    return result.accuracy
