"""Hypothesis strategies shared by the scheduler's property tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st
from test_scheduler_round import pool

MARKETS = ["spot", "on_demand", "reserved"]


@st.composite
def pool_lists(draw: Any, accelerators: Sequence[str], max_pools: int) -> list[Any]:
    """1 to ``max_pools`` pools of the given accelerators: 1, 4 or 8 devices a node over 1 to 4 nodes,
    any market (spot pools interrupted 0.1 times an hour), a list price of 0.5 to 4 $/device-hour and
    any number of devices free."""
    pools = []
    for i in range(draw(st.integers(1, max_pools))):
        per_node = draw(st.sampled_from([1, 4, 8]))
        nodes = draw(st.integers(1, 4))
        market = draw(st.sampled_from(MARKETS))
        pools.append(
            pool(
                f"p{i}",
                draw(st.sampled_from(list(accelerators))),
                draw(st.sampled_from([0.5, 1.0, 2.0, 4.0])),
                market=market,
                per_node=per_node,
                nodes=nodes,
                available=draw(st.integers(0, per_node * nodes)),
                interruption_rate_per_hour=0.1 if market == "spot" else None,
            )
        )
    return pools
