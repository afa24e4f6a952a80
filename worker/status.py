"""`krill worker status`: the account's standing plus what became of its contributions.

Design decisions:
- Two views of the contributions, each labelled with where it comes from: the worker's own log
  (`contributions.jsonl`: committed, or dropped and why, e.g. stale) always; the coordinator's
  verdicts (accepted, rejected with reason codes) only when an index database for this deployment
  is at hand, since nothing on-chain records them; otherwise "unknown (no index)". Accepted means
  folded into a published version; accepted ones not yet there are counted apart, and so are the
  commits the index holds with no decision, saying so when the index has none of the run's
  decisions (`krill.account_status.contributions_from_index`).
- The log is counted per nonce, its last line winning: a crash between an outcome's log line and
  the state write that clears the pending entry repeats the line on restart, marked `resumed`
  (`krill.worker.nonce_state`), and that is still one contribution.
- Status needs no password: the address comes from the keystore's public fields. It never creates
  the worker's state (see `WorkerState.peek`), so running it cannot hide a lost state directory
  from the nonce recovery of the next `run`.
"""

from __future__ import annotations

from collections import Counter

from krill.config import KrillConfig


def _local(config: KrillConfig, address: str, run_id: bytes | None) -> dict | None:
    from krill.runtime import role_state_dir
    from krill.worker.nonce_state import WorkerState

    if run_id is None:
        return None
    state = WorkerState.peek(role_state_dir(config, "worker", address), run_id, address)
    if state is None:
        return {"next_nonce": 0, "pending": None, "committed": 0, "dropped": {}, "recent_dropped": [], "log": None}
    latest: dict = {}  # nonce -> its last line, in the order of those last lines
    for h in state.history():
        latest.pop(h.get("nonce"), None)
        latest[h.get("nonce")] = h
    outcomes = list(latest.values())
    dropped = [h for h in outcomes if h.get("status") != "committed"]
    return {
        "next_nonce": state.next_nonce,
        "pending": None if state.pending is None else {"nonce": state.pending.nonce,
                                                       "version": state.pending.model_version},
        "committed": len(outcomes) - len(dropped),
        "dropped": dict(sorted(Counter(h.get("status", "?") for h in dropped).items())),
        "recent_dropped": [{"nonce": h.get("nonce"), "status": h.get("status"), "detail": h.get("detail", "")}
                           for h in dropped[-5:]],
        "log": str(state.log_path),
    }


def _undecided(verdicts: dict) -> str:
    """The commits the index holds with no coordinator decision, and why none may be there."""
    if not verdicts["undecided"]:
        return ""
    why = "" if verdicts["decisions_indexed"] else \
        " (this index holds none of the coordinator's decisions on the run: an index synced from the chain has none)"
    return f"; {verdicts['undecided']} committed with no decision in the index{why}"


def worker_status(config: KrillConfig):
    """(AccountStatus, table rows, JSON extra, detail lines) of the configured worker."""
    from krill.account_status import account_status, contributions_from_index, open_index
    from krill.keystore import read_info, resolve_keystore
    from krill.runtime import connect_chain, run_id_of

    address = read_info(resolve_keystore(config.keystore.path)).address
    run_id = run_id_of(config) if config.run.id else None
    chain = connect_chain(config)
    index = open_index(config)
    try:
        status = account_status(config, "worker", chain, address, index, run_id)
        verdicts = (contributions_from_index(index, run_id, address, status.run["latest_version"])
                    if run_id is not None and status.run is not None else None)
    finally:
        index.close()
    local = _local(config, address, run_id)
    rows, details = [], []
    if local is None:
        rows.append(("contributions", "unknown (run.id is not set)"))
        status.hints.append("set run.id in the config to see this run's contributions (`krill worker init` finds it)")
    else:
        dropped = ", ".join(f"{k} {v}" for k, v in local["dropped"].items())
        pending = f"; nonce {local['pending']['nonce']} pending at v{local['pending']['version']}" \
            if local["pending"] else ""
        rows.append(("contributions", f"{local['committed']} committed, {sum(local['dropped'].values())} dropped"
                     + (f" ({dropped})" if dropped else "") + f"; next nonce {local['next_nonce']}{pending}"))
        details += [f"dropped nonce {d['nonce']}: {d['status']}: {d['detail']}" for d in local["recent_dropped"]]
    if verdicts is None:
        rows.append(("coordinator", status.index if run_id is not None else "unknown (run.id is not set)"))
    else:
        reasons = ", ".join(f"{k} {v}" for k, v in verdicts["rejected_by_reason"].items())
        unpublished = verdicts["accepted_unpublished"]
        rows.append(("coordinator", f"{verdicts['accepted']} accepted"
                     + (f" (+ {unpublished} accepted, not in a published version yet)" if unpublished else "")
                     + f", {verdicts['rejected']} rejected" + (f" ({reasons})" if reasons else "")
                     + f", {verdicts['pending']} pending" + _undecided(verdicts)))
        details += [f"rejected commit #{r['commit_id']} (v{r['version']}): {r['reason_code']}: {r['reason']}"
                    for r in verdicts["recent_rejections"]]
    extra = {"local": local, "contributions": verdicts,
             "contributions_source": "index" if verdicts is not None else status.index}
    return status, rows, extra, details
