"""`krill verifier status`: the account's standing plus what this verifier decided on the run's commits.

Design decisions:
- The verdicts come from the verifier's own state file (attested passed/failed, not selected,
  missed, errors, pending, and which attested commits it replayed to corroborate another
  verifier's failing verdict rather than because it was selected): always there, and the only
  record of commits it skipped or missed.
  The index, when there is one, adds what the chain recorded of its attestations, a check that
  the two agree.
- Status needs no password (the keystore's public address) and opens the state file only if it
  exists, so it never leaves an empty one behind. It opens it read-only
  (`VerifierState.open_read_only`): it never writes to a running verifier's file, and a lock it
  cannot get within `READ_WAIT_S` makes the attestations "unknown" with the reason, not a
  failure. Opened for writing, status waited 30 s behind the verifier's write transaction and
  then failed with sqlite's "database is locked".
"""

from __future__ import annotations

import sqlite3

from krill.config import KrillConfig


def _local(config: KrillConfig, address: str, run_id: bytes | None) -> dict | None:
    from krill.runtime import role_state_dir
    from krill.verifier.state import VerifierState

    if run_id is None:
        return None
    directory = role_state_dir(config, "verifier", address)
    contract = config.chain.protocol_address
    path = VerifierState.path_for(directory, contract=contract, run_id=run_id)
    if not path.exists():
        return {"attested": 0, "passed": 0, "failed": 0, "skipped": 0, "missed": 0, "error": 0, "pending": 0,
                "corroborated": 0, "corroborated_failed": 0, "corroborating": 0, "cursor": None, "state": None}
    try:
        state = VerifierState.open_read_only(path, contract=contract, run_id=run_id, verifier=address)
        try:
            return state.snapshot() | {"state": str(state.path)}
        finally:
            state.close()
    except sqlite3.Error as exc:
        # Deliberately tolerated: status still reports the chain's figures; the next status reads again.
        return {"state": str(path), "unreadable": f"{type(exc).__name__}: {exc}"}


def verifier_status(config: KrillConfig):
    """(AccountStatus, table rows, JSON extra, detail lines) of the configured verifier."""
    from krill.account_status import account_status, open_index, verdicts_from_index
    from krill.keystore import read_info, resolve_keystore
    from krill.runtime import connect_chain, run_id_of

    address = read_info(resolve_keystore(config.keystore.path)).address
    run_id = run_id_of(config) if config.run.id else None
    chain = connect_chain(config)
    index = open_index(config)
    try:
        status = account_status(config, "verifier", chain, address, index, run_id)
        onchain = verdicts_from_index(index, address)
    finally:
        index.close()
    local = _local(config, address, run_id)
    rows = []
    if local is None:
        rows.append(("attestations", "unknown (run.id is not set)"))
        status.hints.append("set run.id in the config to see this run's attestations "
                            "(`krill verifier init` finds it)")
    elif "unreadable" in local:
        rows.append(("attestations", f"unknown (state file {local['state']} unreadable now: {local['unreadable']})"))
    else:
        rows.append(("attestations", f"{local['attested']} attested: {local['passed']} passed, {local['failed']} "
                     f"failed; {local['skipped']} not selected, {local['missed']} missed, {local['error']} errors, "
                     f"{local['pending']} pending"))
        rows.append(("corroborations", f"{local['corroborated']} attested though not selected, after another "
                     f"verifier's failing verdict ({local['corroborated_failed']} failed too); "
                     f"{local['corroborating']} pending"))
    rows.append(("on-chain verdicts", status.index if onchain is None else
                 f"{onchain['passed']} passing, {onchain['failed']} failing (all runs, index)"))
    extra = {"attestations": local, "onchain_verdicts": onchain,
             "onchain_verdicts_source": "index" if onchain is not None else status.index}
    return status, rows, extra, []
