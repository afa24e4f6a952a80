"""The explorer's addresses: one table of routes, each serving a page and the same data as JSON.

Design decisions:
- A route is a pattern, a template and a data function. `/x` renders `x`'s template with the
  data; `/api/x` returns the very same data as JSON. So the API is documented once (`/api`, and
  the README) and cannot drift from the pages.
- Path parameters are matched by strict patterns (decimal numbers, 40 or 64 hex characters), and
  query parameters are parsed by `krill.explorer.paging`; nothing from a request reaches SQL
  except as a bound parameter.
- Run-scoped routes take `?run=` (64 hex), defaulting to the most recently created run.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from krill.explorer.contributions import STATUSES, contribution_detail, evidence_detail, list_contributions
from krill.explorer.overview import overview, resolve_run, run_row, runs_stmt
from krill.explorer.paging import (
    BadRequest,
    address_value,
    choice_param,
    hex32_value,
    int_param,
    paginate,
)
from krill.explorer.participants import (
    ROLES,
    contributions_of,
    list_participants,
    participant_detail,
    rewards_of,
    slashes_of,
    verdicts_by,
)
from krill.explorer.versions import list_versions, version_detail

ADDRESS = r"(?P<address>0x[0-9a-fA-F]{40})"
NUMBER = r"(?P<number>[0-9]{1,18})"
DIGEST = r"(?P<digest>[0-9a-fA-F]{64})"


@dataclass(frozen=True)
class Route:
    pattern: re.Pattern[str]
    template: str
    data: Callable[..., dict[str, Any]]
    doc: str
    example: str


def _run(ctx) -> Any:
    raw = ctx.params.get("run")
    return resolve_run(ctx.session, hex32_value(raw, "parameter 'run'") if raw else None)


def _overview(ctx) -> dict[str, Any]:
    return overview(ctx.session, _run(ctx))


def _runs(ctx) -> dict[str, Any]:
    return paginate(ctx.session, runs_stmt(), ctx.page(), run_row).to_json()


def _versions(ctx) -> dict[str, Any]:
    run = _run(ctx)
    return {"run_id": run.run_id, **list_versions(ctx.session, run, ctx.page(), ctx.audit).to_json()}


def _version(ctx, number: str) -> dict[str, Any]:
    return version_detail(ctx.session, _run(ctx), int(number), ctx.page(), ctx.audit, ctx.store)


def _participants(ctx) -> dict[str, Any]:
    role = choice_param(ctx.params, "role", ROLES)
    return {"role": role, **list_participants(ctx.session, ctx.page(), role).to_json()}


def _participant(ctx, address: str) -> dict[str, Any]:
    return participant_detail(ctx.session, address_value(address), ctx.page())


def _sublist(kind: str, fn):
    def data(ctx, address: str) -> dict[str, Any]:
        address = address_value(address)
        return {"address": address, "kind": kind, **fn(ctx.session, address, ctx.page()).to_json()}
    return data


def _contributions(ctx) -> dict[str, Any]:
    run = _run(ctx)
    status = choice_param(ctx.params, "status", STATUSES)
    worker = address_value(ctx.params["worker"]) if ctx.params.get("worker") else None
    version = int_param(ctx.params, "version", -1, 0) if ctx.params.get("version") else None
    page = list_contributions(ctx.session, run, ctx.page(), status, worker, version)
    return {"run_id": run.run_id, "filters": {"status": status, "worker": worker, "version": version},
            **page.to_json()}


def _contribution(ctx, number: str) -> dict[str, Any]:
    return contribution_detail(ctx.session, int(number), ctx.store)


def _evidence(ctx, digest: str) -> dict[str, Any]:
    return evidence_detail(ctx.session, hex32_value(digest, "an evidence digest"), ctx.store)


def _route(path: str, template: str, data, doc: str, example: str) -> Route:
    return Route(re.compile(f"^{path}$"), template, data, doc, example)


PAGED = " Paginated: `page`, `per_page`."
ROUTES: tuple[Route, ...] = (
    _route("/", "overview.html", _overview,
           "Run parameters, per-version series (accuracy, mean reward, contributions, throughput) and totals "
           "(contributions, verdicts, slashes, stake by role, rewards). `run` selects the run.", "/api/"),
    _route("/runs", "runs.html", _runs, "Every run in the index, newest first." + PAGED, "/api/runs"),
    _route("/versions", "versions.html", _versions,
           "Published versions, newest first: manifest and record CIDs, metrics, eval accuracy, audit status."
           + PAGED, "/api/versions?page=1&per_page=25"),
    _route(f"/versions/{NUMBER}", "version.html", _version,
           "One version: manifest CID, shard CIDs, evals, audit status, the contributions its record names "
           "(weights, trust, staleness; paginated) and the aggregation record from the store (accepted and "
           "rejected entries, per-shard trimmed fractions).", "/api/versions/1"),
    _route("/participants", "participants.html", _participants,
           "Workers and verifiers: stake, trust, commits, checks passed/failed, contributions accepted/"
           "rejected, slashes, rewards. `role` = worker | verifier." + PAGED, "/api/participants?role=worker"),
    _route(f"/participants/{ADDRESS}", "participant.html", _participant,
           "One participant, its rejection reasons and the first page of each of its lists.",
           "/api/participants/0x…"),
    _route(f"/participants/{ADDRESS}/contributions", "sublist.html", _sublist("contributions", contributions_of),
           "A worker's commits with the coordinator's treatment (status, reason, weight)." + PAGED,
           "/api/participants/0x…/contributions"),
    _route(f"/participants/{ADDRESS}/verdicts", "sublist.html", _sublist("verdicts", verdicts_by),
           "Verdicts a verifier attested, with evidence digests." + PAGED, "/api/participants/0x…/verdicts"),
    _route(f"/participants/{ADDRESS}/slashes", "sublist.html", _sublist("slashes", slashes_of),
           "Slashes of a worker, each with the failing verdicts and their evidence." + PAGED,
           "/api/participants/0x…/slashes"),
    _route(f"/participants/{ADDRESS}/rewards", "sublist.html", _sublist("rewards", rewards_of),
           "Rewards, bounties credited and claims of an account." + PAGED, "/api/participants/0x…/rewards"),
    _route("/contributions", "contributions.html", _contributions,
           "Commits of the run, newest first; filters `status` (accepted | rejected | pending | unseen), "
           "`worker`, `version`." + PAGED, "/api/contributions?status=rejected"),
    _route(f"/contributions/{NUMBER}", "contribution.html", _contribution,
           "One contribution: commit transaction, indexed header fields, signature re-verified against the "
           "staked key (with a store), the coordinator's treatment, verdicts with evidence, the slash.",
           "/api/contributions/1"),
    _route(f"/evidence/{DIGEST}", "evidence.html", _evidence,
           "An evidence document by the digest attested on-chain: the verdicts naming it and every check with "
           "its figures.", "/api/evidence/<64 hex>"),
)


def match(path: str) -> tuple[Route, dict[str, str]] | None:
    for route in ROUTES:
        m = route.pattern.fullmatch(path)
        if m:
            return route, m.groupdict()
    return None


def search_target(query: str, run: str | None = None) -> str:
    """Where a search box query leads: an address, a commit id, a version ('v12') or an evidence digest.

    A search from a page of a given run (`run`) stays in that run, as the page's links do: 'v12'
    is that run's version 12, not the latest run's."""
    q = query.strip()
    suffix = "?run=" + hex32_value(run, "parameter 'run'") if run else ""
    if re.fullmatch(r"(0x)?[0-9a-fA-F]{40}", q):
        return f"/participants/{address_value(q)}{suffix}"
    if re.fullmatch(r"[0-9]{1,18}", q):
        return f"/contributions/{int(q)}{suffix}"
    if re.fullmatch(r"[vV][0-9]{1,18}", q):
        return f"/versions/{int(q[1:])}{suffix}"
    if re.fullmatch(r"(0x)?[0-9a-fA-F]{64}", q):
        return f"/evidence/{hex32_value(q, 'a digest')}{suffix}"
    raise BadRequest("search for an address (0x…), a commit id, a version (v12) or an evidence digest")
