"""The Krill explorer role (imported as krill.explorer): a read-only audit site over the index.

Depends on the core, never on another role. Layout follows the data:
    database.py      open the index read-only (enforced by the database)
    paging.py        strict request parameters, capped pagination
    overview.py      the run, its per-version series and totals
    versions.py      versions, shards, folded contributions, records
    participants.py  workers and verifiers, their contributions, verdicts, slashes, rewards
    contributions.py commits and the evidence of verdicts on them
    store_view.py    records, evidence and signed headers from the (untrusted) content store
    audit_status.py  per-version results of `krill audit --json`
    charts.py        inline SVG charts, templating.py page filters, templates/ and static/
    routes.py        one table of addresses: each a page and the same data under /api
    web.py           the WSGI app with security headers; server.py serves it; cli.py is `krill explorer`
"""
