"""The KV offload series the dashboards query, found where they were exported: vLLM's CPU build
cannot offload, so no live scrape here has them; the H200 run of scripts/gpu/kv_offload.py
recorded every connector counter of the offloading server's /metrics (run 16)."""

from __future__ import annotations

import json

from promkit import ROOT

from ministream_observability import catalog
from ministream_observability.alerts import AlertParams
from ministream_observability.generate import queries
from ministream_observability.promql import metric_names

RUN = ROOT / "docs" / "results" / "h200" / "run16"


def _recorded(side: str) -> set[str]:
    names: set[str] = set()
    for path in sorted(RUN.glob("call*/kv-offload.json")):
        for block in json.loads(path.read_text())["blocks"]:
            if block["side"] == side:
                names |= set(block["counters"])
    return names


def test_offload_series_exist_on_an_offloading_server() -> None:
    on = _recorded("on")
    assert on >= catalog.OFFLOAD_ONLY, sorted(catalog.OFFLOAD_ONLY - on)
    external = {str(catalog.EXTERNAL_PREFIX_HITS), str(catalog.EXTERNAL_PREFIX_QUERIES)}
    assert external <= on
    # ... and only there: the server without offload exported none of them.
    assert not catalog.OFFLOAD_ONLY & _recorded("off")


def test_a_dashboard_shows_offload_traffic_and_the_tier_hit_rate() -> None:
    used = {
        name for q in queries(AlertParams()) if q.kind == "panel" for name in metric_names(q.promql)
    }
    assert used >= catalog.OFFLOAD_ONLY
    assert str(catalog.EXTERNAL_PREFIX_HITS) in used
