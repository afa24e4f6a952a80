"""Release parts without a chain: the deterministic archive, contributor shares, card numbers."""

from __future__ import annotations

import io
import tarfile

import pytest

from krill.errors import PayloadError
from krill.protocol.record import AcceptedEntry, AggregationRecord, RejectedEntry
from krill.release.archive import read_archive, write_archive
from krill.release.card import _tokens
from krill.release.contributors import contributors

FILES = {"config.json": b"{}", "model.safetensors": b"\x00" * 1000, "README.md": b"# card\n"}


def test_archive_bytes_depend_only_on_the_files():
    first = write_archive("krill-x-v1", FILES)
    again = write_archive("krill-x-v1", dict(reversed(list(FILES.items()))))
    assert first == again
    assert write_archive("krill-x-v1", {**FILES, "README.md": b"# other\n"}) != first
    with tarfile.open(fileobj=io.BytesIO(first)) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["krill-x-v1", "krill-x-v1/README.md", "krill-x-v1/config.json",
                                         "krill-x-v1/model.safetensors"]
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}
    assert read_archive(first) == ("krill-x-v1", FILES)


def _tar(members):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def _member(name, kind=tarfile.REGTYPE, data=b"x"):
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, (len(data) if kind == tarfile.REGTYPE else 0)
    if kind == tarfile.SYMTYPE:
        info.linkname = "/etc/passwd"
    return info, (data if kind == tarfile.REGTYPE else None)


@pytest.mark.parametrize("bad", ["../escape", "/abs", "other/file", "link"])
def test_read_archive_refuses_what_write_archive_never_writes(bad):
    members = [_member("rel", tarfile.DIRTYPE)]
    members.append(_member("rel/link", tarfile.SYMTYPE) if bad == "link" else _member(bad))
    with pytest.raises(PayloadError):
        read_archive(_tar(members))
    with pytest.raises(PayloadError):
        read_archive(b"not a tar archive at all" * 40)
    with pytest.raises(PayloadError):
        write_archive("rel", {"../x": b""})


def _record(version, accepted, rejected=()):
    return AggregationRecord(run_id="ab" * 32, version=version, parent_manifest_cid="p", parent_record_cid=None,
                             manifest_cid="m", rule={}, shards=[], masks_cid="k", masks_sha256="00" * 32, closed_by="count",
                             rejected=list(rejected),
                             accepted=[AcceptedEntry(commit_id=c, worker=w, header_digest="00" * 32, model_version=0,
                                                     behaviour_version=0, staleness=0, trust="0.5", weight=wt,
                                                     shards=[0], mean_reward="0.0", tokens=10) for c, w, wt in accepted])


def test_contributors_count_work_per_worker_and_share_rewards_from_the_chain():
    a, b, c = ("0x" + ch * 40 for ch in "abc")
    records = {1: ("cid1", _record(1, [(1, a, "0.5"), (2, b, "0.25")])),
               2: ("cid2", _record(2, [(3, a, "0.5")], [RejectedEntry(commit_id=4, worker=c, reason_code="stale",
                                                                       reason="too old")]))}
    people = contributors(records, {a: 3 * 10**18, b.upper().replace("0X", "0x"): 10**18})
    by = {p.address: p for p in people}
    assert [p.address for p in people] == [a, b, c]
    assert (by[a].accepted, by[a].weight, by[a].tokens, by[a].share) == (2, 1.0, 20, 0.75)
    assert (by[b].accepted, by[b].rewards, by[b].share) == (1, 10**18, 0.25)
    assert (by[c].accepted, by[c].rejected, by[c].rewards, by[c].share) == (0, 1, 0, 0.0)


@pytest.mark.parametrize("weight", ["abc", "nan", "inf"])
def test_a_weight_that_is_no_finite_number_refuses_the_contributors_table(weight):
    """Possible in a record the release did not audit (`--audit-last`): it was a bare ValueError, or a NaN row."""
    a = "0x" + "a" * 40
    records = {1: ("cid1", _record(1, [(1, a, "0.5")])), 2: ("cid2", _record(2, [(7, a, weight)]))}
    with pytest.raises(PayloadError, match=f"the record of version 2 gives commit 7 the weight '{weight}'"):
        contributors(records, {})


def test_token_amounts_print_exactly():
    assert _tokens(10 * 10**18) == "10.0000"
    assert _tokens(6_666_666_666_666_666_666) == "6.6666"
    assert _tokens(0) == "0.0000"


def _report(version, failed=()):
    from krill.audit import AuditReport

    report = AuditReport(run_id="ab" * 32, version=version)
    report.add("published", True, "")
    report.add("manifest digest", "manifest digest" not in failed, "")
    for name in failed:
        if name != "manifest digest":
            report.add(name, False, "")
    return report


def test_the_lineage_audit_stops_at_the_first_failing_version_and_names_its_checks(monkeypatch):
    import krill.audit
    from krill.release.lineage import ReleaseAuditError, audit_lineage

    bad = {3: ("manifest digest", "shard 1 weights")}
    audited = []

    def fake_audit(source, version):
        audited.append(version)
        return _report(version, bad.get(version, ()))

    monkeypatch.setattr(krill.audit, "audit_version", fake_audit)
    seen = []
    facts = audit_lineage(None, None, _spec(), 2, progress=lambda r, last: seen.append((r.version, last)))
    assert (facts.to_dict(), audited, seen) == ({"audited": True, "versions": [1, 2], "checks": 4, "not_audited": []},
                                                [1, 2], [(1, 2), (2, 2)])
    audited.clear()
    with pytest.raises(ReleaseAuditError) as refused:
        audit_lineage(None, None, _spec(), 6)
    assert audited == [1, 2, 3]  # nothing after the first failure is audited: the release is refused anyway
    assert (refused.value.version, refused.value.failed) == (3, ("manifest digest", "shard 1 weights"))
    message = str(refused.value)
    assert message.startswith("version 3, an ancestor of version 6, fails `krill audit` (2 of 3 checks: "
                              "manifest digest, shard 1 weights)") and "\n" not in message
    assert audit_lineage(None, None, _spec(), 0).to_dict() == {"audited": True, "versions": [], "checks": 0,
                                                               "not_audited": []}


def test_audit_last_audits_only_the_last_versions_and_names_the_rest_not_audited(monkeypatch):
    import krill.audit
    from krill.release.lineage import ReleaseAuditError, audit_lineage, first_audited, not_audited

    audited = []

    def fake_audit(source, version):
        audited.append(version)
        return _report(version, ("manifest digest",) if version == 3 else ())

    monkeypatch.setattr(krill.audit, "audit_version", fake_audit)
    assert [first_audited(6, n) for n in (None, 1, 3, 6, 400)] == [1, 6, 4, 1, 1]
    facts = audit_lineage(None, None, _spec(), 6, first=first_audited(6, 3))
    assert audited == [4, 5, 6]  # version 3, which fails, is not recomputed: only what ran is claimed
    assert facts.to_dict() == {"audited": True, "versions": [4, 6], "checks": 6, "not_audited": [1, 3]}
    audited.clear()
    assert audit_lineage(None, None, _spec(), 2, first=first_audited(2, 5)).to_dict() == {
        "audited": True, "versions": [1, 2], "checks": 4, "not_audited": []}
    with pytest.raises(ReleaseAuditError) as refused:
        audit_lineage(None, None, _spec(), 4, first=first_audited(4, 2))
    assert refused.value.version == 3 and str(refused.value).startswith("version 3, an ancestor of version 4,")
    assert not_audited(4).to_dict() == {"audited": False, "versions": [], "checks": 0, "not_audited": [1, 4]}


def _spec():
    from krill.payload.limits import PayloadLimits
    from krill.protocol.spec import RunSpec

    return RunSpec(name="x", seed=1, task="arithmetic", num_shards=2, limits=PayloadLimits(vocab_size=100),
                   base_manifest_cid="bafkreiacwe4tcpgwzlcm3qw75ct37n4k5wz5z7uwqdqtwuvb2xg5sbotkq")


@pytest.mark.parametrize("audit", [{"audited": True, "versions": [1, 5], "checks": 321, "not_audited": []},
                                   {"audited": False, "versions": [], "checks": 0, "not_audited": [1, 5]}])
def test_the_card_states_the_audit_that_ran_and_only_that(audit):
    from krill.release.card import render_card

    result = {"accuracy": 0.5, "pass_at_k": None, "mean_length": 3.0, "k": 1, "n": 4}
    provenance = {"chain_id": 31337, "contract": "0x" + "1" * 40, "run_id": "ab" * 32, "run_spec_cid": "s",
                  "base_manifest_cid": "b", "manifest_cid": "m", "manifest_digest": "cd" * 32, "published_block": 9,
                  "record_cids": {"1": "r1"}}
    card = render_card(spec=_spec(), version=5, evals={"base": result, "version": result, "seed": 0},
                       provenance=provenance, audit=audit, contributors=[], folder="krill-x-v5")
    claims = "`krill audit` recomputed versions 1..5 from public data (chain and store) and all 321 checks passed"
    assert (claims in card) == audit["audited"]
    assert ("**Not audited**" in card) == (not audit["audited"])


def test_a_card_of_a_partial_audit_names_the_versions_not_audited():
    from krill.release.card import render_card

    result = {"accuracy": 0.5, "pass_at_k": None, "mean_length": 3.0, "k": 1, "n": 4}
    provenance = {"chain_id": 31337, "contract": "0x" + "1" * 40, "run_id": "ab" * 32, "run_spec_cid": "s",
                  "base_manifest_cid": "b", "manifest_cid": "m", "manifest_digest": "cd" * 32, "published_block": 9,
                  "record_cids": {"1": "r1"}}
    audit = {"audited": True, "versions": [398, 400], "checks": 39, "not_audited": [1, 397]}
    card = render_card(spec=_spec(), version=400, evals={"base": result, "version": result, "seed": 0},
                       provenance=provenance, audit=audit, contributors=[], folder="krill-x-v400")
    assert ("> **Partly audited**: only versions 398..400 were checked with `krill audit` when this release was "
            "made; versions 1..397 were not (see Provenance).") in card
    assert ("`krill audit` recomputed versions 398..400 from public data (chain and store), each from its published "
            "parent, and all 39 checks passed. Versions 1..397 were **not** audited") in card
    assert "recomputed versions 1.." not in card and "Not audited" not in card
