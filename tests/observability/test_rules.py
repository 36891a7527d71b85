"""promtool against the shipped files: every alert expression and every dashboard query
parses, the alert unit tests (rules_test.yaml) pass, and both checks have teeth."""

from __future__ import annotations

import shutil
from pathlib import Path

from promkit import ROOT, promtool, recording_rules_file

from ministream_observability.alerts import AlertParams
from ministream_observability.generate import RULES_FILE, Query, queries

UNIT_TESTS = ROOT / "tests" / "observability" / "rules_test.yaml"


def test_alert_rules_parse() -> None:
    out = promtool("check", "rules", ROOT / RULES_FILE)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 13 rules found" in out.stdout


def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    """Dashboard queries (Grafana variables replaced) as recording rules: promtool parses
    each one with Prometheus's own parser."""
    qs = [q for q in queries(AlertParams()) if q.kind != "alert"]
    out = promtool("check", "rules", recording_rules_file(qs, tmp_path / "queries.yaml"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(qs)} rules found" in out.stdout


def test_a_broken_query_fails_the_parse_check(tmp_path: Path) -> None:
    broken = Query("broken", "histogram_quantile(0.95, sum by (le) rate(x_bucket[5m]))", "panel")
    out = promtool("check", "rules", recording_rules_file([broken], tmp_path / "broken.yaml"))
    assert out.returncode != 0 and "parse error" in (out.stdout + out.stderr)


def test_alert_unit_tests() -> None:
    out = promtool("test", "rules", UNIT_TESTS)
    assert out.returncode == 0, out.stdout + out.stderr


def test_unit_tests_catch_a_counter_without_total(tmp_path: Path) -> None:
    """The classic broken alert: a counter queried without `_total` never fires. The unit
    tests must notice (they run against a copy of the rules with that mistake)."""
    rules = tmp_path / "charts" / "ministream" / "rules" / "ministream-alerts.yaml"
    rules.parent.mkdir(parents=True)
    text = (ROOT / RULES_FILE).read_text()
    assert "vllm:num_preemptions_total" in text
    rules.write_text(text.replace("vllm:num_preemptions_total", "vllm:num_preemptions"))
    (tmp_path / "tests" / "observability").mkdir(parents=True)
    shutil.copy(UNIT_TESTS, tmp_path / "tests" / "observability" / "rules_test.yaml")
    out = promtool("test", "rules", tmp_path / "tests" / "observability" / "rules_test.yaml")
    assert out.returncode != 0
    assert "alertname: MiniStreamPreempting" in out.stdout + out.stderr
