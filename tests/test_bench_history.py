"""The ``history`` part of ``bench/run.py`` (``bench/history.py``) on a small store of the test Redis:
its store is filled as the part fills it (sends in pipelines of ``send.lua``, and through
``Relay.send``), every envelope is accounted for, the thread read finds the thread of 6 (the part
raises otherwise), the search finds the day's needles and reads what the docs say it reads."""

from __future__ import annotations

import secrets

import pytest

from bench.history import NEEDLE, history_figures
from broker.limits import HISTORY_SCAN


@pytest.mark.parametrize("through_relay", [False, True], ids=["pipelined", "relay"])
async def test_the_history_part_fills_its_store_and_accounts_for_every_envelope(
    redis_url: str, through_relay: bool
) -> None:
    stored = 6000
    figures = await history_figures(
        redis_url,
        stored,
        rounds=1,
        duration=0.2,
        through_relay=through_relay,
        bytes_count=500,
        tag=f"tbh{secrets.token_hex(3)}",
    )
    assert figures["history_lost"] == 0
    assert figures["history_duplicated"] == 0
    assert figures["history_stored"] == stored
    assert figures["history_fill"] == ("relay" if through_relay else "pipelined")
    archived = stored - stored // 10
    # the day is every archived envelope here (the store is smaller than a day), the thread's 4 too
    assert figures["search_day_envelopes"] == archived + 4
    assert figures["search_day_found"] == archived // NEEDLE
    assert figures["search_day_read"] <= 20 * (100 + HISTORY_SCAN)
    assert figures["search_agent_day_found"] <= figures["search_day_found"]  # its own mail only
    assert 300 < figures["history_bytes_per_envelope"] < 1000
    assert figures["thread_read_p50_ms"] > 0 and figures["core_ratio_history"] > 0
