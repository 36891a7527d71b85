"""Small PromQL builders shared by dashboards and alerts, and the checks' PromQL reader.

Dashboards and alerts build every query through these functions, so a quantile is always
`histogram_quantile(q, sum by (..., le) (rate(<name>_bucket[...])))` and a ratio of counters
is always a ratio of `rate()`s — the two mistakes that make dashboards quietly lie.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from .catalog import Kind, Metric

# Grafana variables the dashboards use, and what the checks put in their place (a regex
# matching everything for label filters, windows Prometheus accepts for the intervals).
GRAFANA_LABEL_VARIABLES = ("namespace", "model", "pod", "router")


def matchers(*parts: str) -> str:
    """Join label matchers, dropping empty ones."""
    return ", ".join(p for p in parts if p)


def sel(metric: Metric | str, selector: str = "", *extra: str) -> str:
    """`name{selector, extra...}`; a histogram must be selected through its bucket name."""
    name = str(metric)
    if isinstance(metric, Metric):
        assert metric.kind is not Kind.HISTOGRAM, f"use {metric.name}_bucket/_sum/_count"
    inner = matchers(selector, *extra)
    return f"{name}{{{inner}}}" if inner else name


def rate(metric: Metric, selector: str, window: str, *extra: str) -> str:
    assert metric.kind is Kind.COUNTER, f"rate() of a {metric.kind.value}: {metric.name}"
    return f"rate({sel(metric, selector, *extra)}[{window}])"


def increase(metric: Metric, selector: str, window: str, *extra: str) -> str:
    assert metric.kind is Kind.COUNTER, f"increase() of a {metric.kind.value}: {metric.name}"
    return f"increase({sel(metric, selector, *extra)}[{window}])"


def by(labels: Sequence[str]) -> str:
    return f"by ({', '.join(labels)}) " if labels else ""


def agg(op: str, labels: Sequence[str], expr: str) -> str:
    return f"{op} {by(labels)}({expr})"


def quantile(
    q: float, metric: Metric, selector: str, window: str, labels: Sequence[str] = ()
) -> str:
    """The q-quantile of a histogram, aggregated across pods and engines with `sum by (le)`."""
    assert metric.kind is Kind.HISTOGRAM, metric.name
    bucket_rate = (
        f"rate({metric.bucket}{{{selector}}}[{window}])"
        if selector
        else f"rate({metric.bucket}[{window}])"
    )
    return f"histogram_quantile({q:g}, sum by ({', '.join([*labels, 'le'])}) ({bucket_rate}))"


def rate_ratio(
    num: Metric,
    den: Metric,
    selector: str,
    window: str,
    labels: Sequence[str] = (),
    num_extra: str = "",
    den_extra: str = "",
) -> str:
    """sum(rate(num)) / sum(rate(den)): a ratio over the window, never of raw counters."""
    return (
        f"{agg('sum', labels, rate(num, selector, window, num_extra))}\n"
        f"/\n{agg('sum', labels, rate(den, selector, window, den_extra))}"
    )


# --------------------------------------------------------------------------------------------
# Reading PromQL back (used by the checks, independent of how a query was built).

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_TOKEN = re.compile(
    r"(?P<num>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?[a-zA-Z]*)"
    r"|(?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)"
    r"|(?P<open>[({\[])|(?P<close>[)}\]])"
    r"|(?P<other>\S)"
)
_KEYWORDS = frozenset(
    {
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "inf",
        "nan",
        "atan2",
        # aggregation operators (may be followed by `by (...)` instead of `(`)
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "limitk",
        "limit_ratio",
    }
)
_LABEL_LIST_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (functions, label names, keywords excluded).

    Label matchers `{...}`, range and subquery brackets `[...]`, and the label lists of
    `by`/`without`/`on`/`ignoring`/`group_left`/`group_right` are skipped; an identifier
    followed by `(` is a function. `{__name__="x"}` selectors are refused: they hide names.
    """
    if "__name__" in expr:
        raise ValueError(f"selector by __name__ hides the metric name: {expr}")
    text = _STRING.sub('""', expr)
    tokens = [(m.lastgroup, m.group()) for m in _TOKEN.finditer(text)]
    names: set[str] = set()
    depth_brace = depth_bracket = 0
    skip_parens = 0  # > 0 while inside a label list
    pending_label_list = False
    for i, (kind, tok) in enumerate(tokens):
        nxt = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if kind == "open":
            if tok == "{":
                depth_brace += 1
            elif tok == "[":
                depth_bracket += 1
            elif skip_parens or pending_label_list:
                skip_parens += 1
                pending_label_list = False
            continue
        if kind == "close":
            if tok == "}":
                depth_brace -= 1
            elif tok == "]":
                depth_bracket -= 1
            elif skip_parens:
                skip_parens -= 1
            continue
        if depth_brace or depth_bracket or skip_parens or kind != "ident":
            continue
        if tok in _LABEL_LIST_KEYWORDS:
            pending_label_list = nxt == "("
            continue
        if tok in _KEYWORDS or nxt == "(":
            continue
        names.add(tok)
    return names


_LABEL_VALUES = re.compile(
    r"^\s*label_values\((?P<selector>.*),\s*(?P<label>[a-zA-Z_]\w*)\s*\)\s*$"
)


def variable_selector(query: str) -> str:
    """The selector of a Grafana `label_values(selector, label)` variable query."""
    m = _LABEL_VALUES.match(query)
    if not m:
        raise ValueError(f"not a label_values(selector, label) query: {query}")
    return m.group("selector")


def concrete(expr: str, *, rate_interval: str = "1m", range_: str = "1h") -> str:
    """A dashboard query with Grafana's variables replaced, as Prometheus would receive it
    with "All" selected (label filters become `.*`)."""
    out = expr.replace("$__rate_interval", rate_interval).replace("$__range", range_)
    out = out.replace("$__interval", rate_interval)
    for var in GRAFANA_LABEL_VARIABLES:
        out = out.replace(f'"${var}"', '".*"').replace(f'"${{{var}}}"', '".*"')
    # `$1` in label_replace is PromQL's own; `$name` anywhere else is a Grafana leftover.
    if "$" in _STRING.sub('""', out) or re.search(r'"\$[a-zA-Z_{]', out):
        raise ValueError(f"unknown Grafana variable left in: {out}")
    return out


def all_names(exprs: Iterable[str]) -> set[str]:
    return {n for e in exprs for n in metric_names(e)}
