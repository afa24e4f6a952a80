"""The unbonding margin: a coordinator refuses to start where it could not slash before a cheater withdraws.

Design decisions:
- The contract releases a worker's unbonding stake `unbondingBlocks` after the later of its unstake
  request and the close of its latest commit's challenge window (`windowEndOf`, `ReleaseDelayed`),
  so the whole unbonding period lies after the window: the challenge window is not subtracted.
- What the coordinator must do in those blocks, in the worst case: a worker commits content it
  never uploads and requests its unstake at once; a verifier fails the commit in the window's last
  block; the coordinator's index sees that verdict `confirmations` blocks later; content nobody
  has can be confirmed missing only by a fetch that fails after the window closed
  (`krill.coordinator.confirm`), which on a networked store waits out the store's timeout (60 s
  on Kubo); the result is taken within a pass (`poll_interval_s` + `PASS_WAIT_S`), and the slash
  transaction needs its block (`SLASH_TX_BLOCKS`, counting the one it is sent in). Where the chain's
  blocks come faster than that, the worker withdrew its whole stake before the slash landed
  (shown on Anvil with unbondingBlocks = window + 1, the least the contract accepts, one block a
  second and a 6 s store timeout). The contract cannot know the store's timeout; the coordinator can.
- So `krill coordinator run` reads the figures at start (unbondingBlocks, the run's window, its
  index depth, the store's fetch timeout, the chain's block time: the mean over the last
  `BLOCK_SAMPLE` blocks) and refuses to start (`UnbondingMarginError`, one line naming the figures
  and what to change) when (unbondingBlocks - confirmations - SLASH_TX_BLOCKS) x block time is less
  than store timeout + poll interval + `PASS_WAIT_S`. `coordinator.allow_short_unbonding = true`
  starts anyway and prints the same figures as a warning.
- A chain whose last blocks all share one timestamp (blocks mined on demand, many a second) has no
  block time to measure: the check says so and lets it start. That is not what a local devnet's
  automine gives over `BLOCK_SAMPLE` blocks: Anvil stamps each block with the wall-clock second it
  was mined in, so on the devnet and the demo the check does run, on the rate of the transactions
  sent lately (a figure anyone there can change by sending more; it holds no margin in seconds).
  They pass it by the devnet's long unbonding period (`krill.chain.devnet`, 50 000 blocks), not by
  being skipped; a devnet deployed with a short one may be refused (or override it).
- The figures are read once, at start: an unbonding period the admin lowers later applies to
  later requests and commits only, and is checked at the next start.
"""

from __future__ import annotations

from dataclasses import dataclass

from krill.errors import ConfigError
from krill.store.fetcher import PASS_WAIT_S

BLOCK_SAMPLE = 256  # blocks over which the chain's recent block time is averaged
SLASH_TX_BLOCKS = 2  # the block a slash is sent in and the one that includes it


class UnbondingMarginError(ConfigError):
    """The run's unbonding period is too short for this coordinator to slash withheld content in time."""


@dataclass(frozen=True)
class Margin:
    """The figures of the check; `block_time_s` None where the chain mines blocks on demand."""

    unbonding_blocks: int
    window_blocks: int
    confirmations: int
    block_time_s: float | None
    fetch_timeout_s: float
    poll_interval_s: float

    @property
    def needed_s(self) -> float:
        """Seconds from the window's close to the slash, after the verdict is seen: fetch and one pass."""
        return self.fetch_timeout_s + self.poll_interval_s + PASS_WAIT_S

    @property
    def spare_blocks(self) -> int:
        """Blocks after the window that the fetch and the pass may take (depth and slash block taken off)."""
        return self.unbonding_blocks - self.confirmations - SLASH_TX_BLOCKS

    @property
    def available_s(self) -> float | None:
        return None if self.block_time_s is None else max(0, self.spare_blocks) * self.block_time_s

    @property
    def safe(self) -> bool:
        return self.available_s is None or self.available_s >= self.needed_s

    def describe(self, override_hint: bool = True) -> str:
        """One line: the figures, and what to change when the margin is short."""
        if self.block_time_s is None:
            return (f"unbonding margin not checked: the chain's last blocks share one timestamp (blocks mined on "
                    f"demand, a local devnet); unbondingBlocks {self.unbonding_blocks}, challenge window "
                    f"{self.window_blocks}")
        figures = (f"unbondingBlocks {self.unbonding_blocks} - confirmations {self.confirmations} - "
                   f"{SLASH_TX_BLOCKS} slash blocks = {self.spare_blocks} blocks after a commit's challenge window "
                   f"({self.window_blocks} blocks) closes, x {self.block_time_s:.3g} s a block = "
                   f"{self.available_s:.1f} s, against {self.needed_s:.1f} s to confirm withheld content (store "
                   f"timeout {self.fetch_timeout_s:g} s + poll interval {self.poll_interval_s:g} s + pass wait "
                   f"{PASS_WAIT_S:g} s)")
        if self.safe:
            return f"unbonding margin: {figures}"
        blocks = self.confirmations + SLASH_TX_BLOCKS + int(self.needed_s / self.block_time_s) + 1
        hint = ", or set coordinator.allow_short_unbonding = true to run anyway" if override_hint else ""
        return (f"unbonding period too short: {figures}; a worker that withholds its content and unstakes at "
                f"once withdraws before the slash lands. Raise the protocol's unbondingBlocks to at least {blocks} "
                f"(setUnbondingBlocks), or lower store.timeout_s or coordinator.poll_interval_s{hint}")


def recent_block_time(chain, sample: int = BLOCK_SAMPLE) -> float | None:
    """Mean seconds per block over the last `sample` blocks, genesis left out (a dev chain's genesis may carry
    timestamp 0, which would make every block look hours long); None when they share one timestamp (or the
    chain has fewer than two blocks after genesis): blocks mined on demand."""
    head = chain.block_number()
    first = max(1, head - sample)
    if head <= first:
        return None
    span = chain.block_time(head) - chain.block_time(first)
    return span / (head - first) if span > 0 else None


def measure(chain, *, window_blocks: int, confirmations: int, fetch_timeout_s: float,
            poll_interval_s: float) -> Margin:
    """The margin on `chain` (a KrillChain): unbondingBlocks and the recent block time read from it."""
    return Margin(unbonding_blocks=int(chain.unbonding_blocks()), window_blocks=int(window_blocks),
                  confirmations=int(confirmations), block_time_s=recent_block_time(chain),
                  fetch_timeout_s=float(fetch_timeout_s), poll_interval_s=float(poll_interval_s))


def check_margin(margin: Margin, allow_short: bool, echo) -> None:
    """Raise UnbondingMarginError when `margin` is short, unless `allow_short` (then `echo` warns);
    `echo` receives the figures otherwise."""
    if margin.safe:
        echo(margin.describe())
        return
    if not allow_short:
        raise UnbondingMarginError(margin.describe())
    echo(f"warning: {margin.describe(override_hint=False)} (running anyway: coordinator.allow_short_unbonding)")
