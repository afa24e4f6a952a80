"""The demo's summary counts as accepted only what a published version folded."""

from __future__ import annotations

from krill.db.models import Contribution, ContributionStatus
from krill.db.session import open_database
from krill.demo.orchestrate import DemoRun, collect_summary
from krill.testing.index_world import FORGER, HONEST, RUN, fill_index_world


def test_contributions_of_a_version_never_published_are_not_counted_as_accepted(tmp_path):
    world = fill_index_world(f"sqlite:///{tmp_path / 'krill.db'}", tmp_path)  # latest published version: 2
    with open_database(world.url) as db, db.write() as s:
        # Journalled into version 3 by a coordinator stopped before publishing it; one validated, not folded.
        for commit_id, folded in ((3, 2), (4, 3), (5, 3), (6, None)):
            s.add(Contribution(commit_id=commit_id, run_id=RUN, worker=HONEST, version=2,
                               status=ContributionStatus.ACCEPTED, weight=0.25, staleness=0, trust=0.25,
                               aggregated_version=folded))
    run = DemoRun(tmp_path, run_id="0x" + RUN, behaviors={HONEST: "honest", FORGER: "forge-rewards"},
                  names={HONEST: "worker-0", FORGER: "worker-1"})
    summary = collect_summary(world.url, run)
    honest, forger = summary["workers"]
    assert summary["versions"] == 2
    assert (honest["name"], honest["accepted"], honest["accepted_unpublished"]) == ("worker-0", 2, 3)
    assert (forger["accepted"], forger["rejected"]) == (0, 1) and "accepted_unpublished" not in forger
    assert summary["accepted_unpublished"] == {"contributions": 3, "versions": [3]}


def test_a_summary_with_everything_published_has_no_unpublished_entry(tmp_path):
    world = fill_index_world(f"sqlite:///{tmp_path / 'krill.db'}", tmp_path)
    run = DemoRun(tmp_path, run_id=RUN, behaviors={HONEST: "honest"}, names={HONEST: "worker-0"})
    summary = collect_summary(world.url, run)
    assert summary["workers"][0]["accepted"] == 1 and "accepted_unpublished" not in summary["workers"][0]
    assert "accepted_unpublished" not in summary


def test_trust_is_the_coordinators_newest_published_weighing_not_the_index_tally(tmp_path):
    """The index's Beta tally over every verdict on a worker's commits can be lifted by any staked account;
    the summary shows what the coordinator weighed in a published version, and nothing for a worker that
    never had a contribution folded."""
    from krill.db.models import Participant

    world = fill_index_world(f"sqlite:///{tmp_path / 'krill.db'}", tmp_path)  # latest published version: 2
    with open_database(world.url) as db, db.write() as s:
        for commit_id, folded, trust in ((3, 2, 0.41), (4, 3, 0.9)):  # v3: journalled, never published
            s.add(Contribution(commit_id=commit_id, run_id=RUN, worker=HONEST, version=2,
                               status=ContributionStatus.ACCEPTED, weight=trust, staleness=0, trust=trust,
                               aggregated_version=folded))
        s.get(Participant, HONEST).trust_alpha = 50.0  # verdicts of verifiers the coordinator does not count
    run = DemoRun(tmp_path, run_id=RUN, behaviors={HONEST: "honest", FORGER: "forge-rewards"},
                  names={HONEST: "worker-0", FORGER: "worker-1"})
    honest, forger = collect_summary(world.url, run)["workers"]
    assert honest["trust"] == 0.41
    assert forger["trust"] is None
