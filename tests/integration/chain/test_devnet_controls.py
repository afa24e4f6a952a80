"""Devnet controls on a real Anvil: a revert the node did not make raises instead of passing silently."""

from __future__ import annotations

import pytest

from krill.chain.anvil import AnvilProcess
from krill.chain.rpc import connect_http, mine, revert, snapshot
from krill.errors import DevnetError


def test_a_revert_to_a_snapshot_anvil_no_longer_holds_raises():
    with AnvilProcess.start(accounts=1) as node:
        w3 = connect_http(node.rpc_url)
        snap = snapshot(w3)
        mine(w3, 3)
        revert(w3, snap)
        assert w3.eth.block_number == 0
        mine(w3, 3)
        with pytest.raises(DevnetError, match="no snapshot"):
            revert(w3, snap)  # consumed by the first revert: Anvil answers false and reverts nothing
        assert w3.eth.block_number == 3
