"""How `make test` spreads the suite over pytest-xdist workers.

A worker takes a whole test module, or a whole one of WHOLE_DIRECTORIES: their session
fixtures (the S3 server and shard sets, the live Prometheus stack, the built images) are too
costly to make once per worker. Groups with the most engine tests go first, so that the long
ones start at once and the many quick ones fill the gaps at the end.

xdist's own `--dist loadgroup` cannot be used: it regroups by rewriting a private attribute
(`item._nodeid`) that pytest 9.2 no longer reads, so every test became its own group.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

WHOLE_DIRECTORIES = {"loading", "observability", "images"}
HEAVY_MARKERS = ("engine", "images")


def group_of(nodeid: str) -> str:
    """tests/loading/test_paths.py::test_x[a] -> tests/loading; other tests -> their module."""
    module = nodeid.split("::", 1)[0]
    parts = module.split("/")
    if len(parts) > 2 and parts[1] in WHOLE_DIRECTORIES:
        return "/".join(parts[:2])
    return module


def heaviest_groups_first(items: list[pytest.Item]) -> None:
    """Reorder `items` in place: groups by their count of engine and image tests, descending;
    the order inside a group, and between groups of equal weight, is kept."""
    weight: Counter[str] = Counter()
    first_seen: dict[str, int] = {}
    for i, item in enumerate(items):
        group = group_of(item.nodeid)
        first_seen.setdefault(group, i)
        if any(item.get_closest_marker(m) for m in HEAVY_MARKERS):
            weight[group] += 1
    items.sort(key=lambda it: (-weight[group_of(it.nodeid)], first_seen[group_of(it.nodeid)]))


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    config.option.loadscopereorder = False  # keep the order heaviest_groups_first made
    return GroupScheduling(config, log)
