"""Every table renderer of the docs, by name (scripts/docs_tables.py reads `TABLES`).

Each renderer reads only the raw files it is registered with and returns the table's lines;
labels that describe a setting (a run's name, a shape) may be written in it, every figure is
read or computed from the raw files. Interval methods come from the one statistics module
(`scripts/interval_stats.py`, which says which method fits which comparison). The renderers
live by area: docs_tables_h200.py, docs_tables_serve.py, docs_tables_rollout.py,
docs_tables_cpu.py; a new area's
module is added to AREAS.
"""

from __future__ import annotations

import docs_tables_cpu
import docs_tables_h200
import docs_tables_rollout
import docs_tables_serve
from docs_tables import Registry

AREAS = (docs_tables_h200, docs_tables_serve, docs_tables_rollout, docs_tables_cpu)


def _merged() -> Registry:
    tables = Registry()
    for area in AREAS:
        for name, spec in area.TABLES.items():
            if name in tables:
                raise ValueError(f"table {name!r} registered in two areas")
            tables[name] = spec
    return tables


TABLES = _merged()
