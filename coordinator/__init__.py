"""The Krill coordinator role (imported as krill.coordinator). Depends on the core, never on another role.

Modules, in the order data flows through them:
    create_run  publish base model + run spec, createRun, fund       (`krill coordinator create-run`)
    context     RunContext: chain, store, database, spec, caches
    ingest      commits -> fetched, validated, accepted/rejected with a RejectionCode
    trust       Beta trust x staleness weight; jailed / stale / below-floor rejections
    close       when version t closes and what goes in; the decision is journalled first
    journal     the coordinator_versions table (crash safety)
    publish     fold + store content + publishVersion (idempotent after a crash)
    settle      reward split pro rata by weight, settle()
    slash       slash() when failing attestations reach the quorum
    evals       held-out greedy accuracy into the evals table
    metrics     metrics rows and the per-version status line
    loop        Coordinator.step / .run                            (`krill coordinator run`)
"""
