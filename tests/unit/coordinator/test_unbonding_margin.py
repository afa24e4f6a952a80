"""The unbonding margin a coordinator checks at start (`krill.coordinator.margin`), on a chain of fake blocks."""

from __future__ import annotations

import pytest

from krill.coordinator.margin import Margin, UnbondingMarginError, check_margin, measure, recent_block_time
from krill.errors import ConfigError


class _Chain:
    """Blocks 0..head, `seconds` apart; unbondingBlocks as given."""

    def __init__(self, head: int, seconds: float, unbonding: int):
        self.head, self.seconds, self.unbonding = head, seconds, unbonding
        self.read: list[int] = []

    def block_number(self) -> int:
        return self.head

    def block_time(self, number: int) -> int:
        self.read.append(number)
        return 1_700_000_000 + int(number * self.seconds)

    def unbonding_blocks(self) -> int:
        return self.unbonding


def test_the_race_the_contract_allows_is_refused_with_the_figures_and_what_to_change():
    """unbondingBlocks = window + 1 (the least the contract accepts), one block a second, a networked store
    that waits 60 s for content nobody has: the cheater withdraws about a minute before the slash lands."""
    margin = measure(_Chain(head=10_000, seconds=1, unbonding=41), window_blocks=40, confirmations=5,
                     fetch_timeout_s=60.0, poll_interval_s=0.5)
    assert (margin.spare_blocks, margin.block_time_s, margin.available_s) == (34, 1.0, 34.0)
    assert not margin.safe
    with pytest.raises(UnbondingMarginError) as err:
        check_margin(margin, allow_short=False, echo=pytest.fail)
    message = str(err.value)
    assert isinstance(err.value, ConfigError) and "\n" not in message
    for figure in ("unbondingBlocks 41", "confirmations 5", "window (40 blocks)", "34.0 s", "62.5 s",
                   "store timeout 60 s", "poll interval 0.5 s", "at least 70", "coordinator.allow_short_unbonding"):
        assert figure in message, (figure, message)


def test_the_override_starts_with_a_warning():
    lines: list[str] = []
    margin = measure(_Chain(head=500, seconds=1, unbonding=5), window_blocks=4, confirmations=0,
                     fetch_timeout_s=6.0, poll_interval_s=0.5)
    check_margin(margin, allow_short=True, echo=lines.append)
    assert len(lines) == 1 and lines[0].startswith("warning: unbonding period too short")
    assert "running anyway" in lines[0]


def test_a_long_unbonding_period_starts():
    lines: list[str] = []
    margin = measure(_Chain(head=10_000, seconds=12, unbonding=50), window_blocks=40, confirmations=5,
                     fetch_timeout_s=60.0, poll_interval_s=0.5)
    check_margin(margin, allow_short=False, echo=lines.append)
    assert margin.available_s == 43 * 12 and lines[0].startswith("unbonding margin: ")


def test_the_window_is_not_taken_off_the_release_counts_from_its_close():
    """The contract releases unbondingBlocks after the close of the latest commit's window."""
    margin = Margin(unbonding_blocks=100, window_blocks=90, confirmations=0, block_time_s=1.0,
                    fetch_timeout_s=60.0, poll_interval_s=0.5)
    assert margin.spare_blocks == 98 and margin.safe


def test_a_chain_that_mines_on_demand_has_no_block_time_and_is_not_checked():
    """Blocks that all share one timestamp (mined on demand, many a second): no block time to turn blocks
    into seconds. (Anvil's automine stamps wall-clock seconds, so its blocks share one only within a second.)"""
    chain = _Chain(head=300, seconds=0, unbonding=5)
    assert recent_block_time(chain) is None
    lines: list[str] = []
    check_margin(measure(chain, window_blocks=4, confirmations=0, fetch_timeout_s=60.0, poll_interval_s=0.5),
                 allow_short=False, echo=lines.append)
    assert lines[0].startswith("unbonding margin not checked")


def test_block_time_is_the_mean_over_the_last_blocks_only():
    chain = _Chain(head=1000, seconds=2, unbonding=5)
    assert recent_block_time(chain) == 2.0 and sorted(chain.read) == [1000 - 256, 1000]
    assert recent_block_time(_Chain(head=0, seconds=2, unbonding=5)) is None  # a chain of one block
    assert recent_block_time(_Chain(head=3, seconds=2, unbonding=5)) == 2.0


class _GenesisAtZero(_Chain):
    """As `_Chain`, with a genesis block stamped 0, as some dev chains stamp it."""

    def block_time(self, number: int) -> int:
        return 0 if number == 0 else super().block_time(number)


def test_a_genesis_stamped_zero_is_left_out_of_the_block_time():
    """A chain younger than the sample: block 0 at timestamp 0 would make the mean block time years long
    and pass any margin."""
    assert recent_block_time(_GenesisAtZero(head=100, seconds=1, unbonding=5)) == 1.0
    margin = measure(_GenesisAtZero(head=100, seconds=1, unbonding=5), window_blocks=4, confirmations=0,
                     fetch_timeout_s=6.0, poll_interval_s=0.5)
    assert not margin.safe
    assert recent_block_time(_GenesisAtZero(head=1, seconds=1, unbonding=5)) is None
