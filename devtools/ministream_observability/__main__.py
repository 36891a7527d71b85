"""`python -m ministream_observability generate|queries|render`."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from .alerts import AlertParams


def _add_params(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("alert parameters (defaults: AlertParams)")
    for f in dataclasses.fields(AlertParams):
        kind = float if f.type == "float" else str
        group.add_argument(
            f"--{f.name.replace('_', '-')}",
            type=kind,
            default=f.default,
            help=f"default: {f.default}",
        )


def _params(args: argparse.Namespace) -> AlertParams:
    return AlertParams(**{f.name: getattr(args, f.name) for f in dataclasses.fields(AlertParams)})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ministream_observability", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="write the dashboards, the rule file, the docs list")
    gen.add_argument("--root", type=Path, default=Path.cwd(), help="repository root")
    gen.add_argument("--check", action="store_true", help="only report out-of-date files")
    _add_params(gen)
    q = sub.add_parser("queries", help="print every shipped PromQL expression")
    _add_params(q)
    render = sub.add_parser("render", help="plot the dashboards from a live Prometheus (PNG)")
    render.add_argument("--prometheus", required=True, help="base URL, e.g. http://127.0.0.1:9090")
    render.add_argument("--out", type=Path, required=True, help="directory for the PNG files")
    render.add_argument("--minutes", type=float, default=10.0, help="time range to plot")
    _add_params(render)
    args = parser.parse_args(argv)
    params = _params(args)

    if args.command == "generate":
        from .generate import stale, write

        if args.check:
            bad = stale(params, args.root)
            for path in bad:
                print(
                    f"out of date: {path} (run python -m ministream_observability generate)",
                    file=sys.stderr,
                )
            return 1 if bad else 0
        for path in write(params, args.root):
            print(f"wrote {path}")
        return 0
    if args.command == "queries":
        from .generate import queries

        for query in queries(params):
            print(f"# {query.origin}\n{query.expr}\n")
        return 0
    from .render import render_dashboards

    for path in render_dashboards(args.prometheus, args.out, params, minutes=args.minutes):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
