"""scripts/bench_routing.py's pieces that need no engine: the workload, the per-policy summary
and the kv_aware wiring (the benchmark itself is `make bench-routing`, not a test)."""

from __future__ import annotations

import json
from types import ModuleType

import pytest

from tests.support.scripts import ScriptImporter


@pytest.fixture
def bench(import_script: ScriptImporter) -> ModuleType:
    return import_script("bench_routing")


def _block(hit: float, ttft: float) -> dict[str, float | int]:
    return {
        "hit_rate": hit,
        "ttft_p50_s": ttft,
        "ttft_p99_s": 2 * ttft,
        "output_tok_s": 10.0,
        "failed": 0,
    }


def test_every_policy_is_compared_with_round_robin(bench: ModuleType) -> None:
    rounds = [
        {
            "round_robin": _block(0.4, 0.10),
            "cache_aware": _block(0.8, 0.05),
            "kv_aware": _block(0.6, 0.08),
        },
        {
            "round_robin": _block(0.5, 0.12),
            "cache_aware": _block(0.9, 0.06),
            "kv_aware": _block(0.7, 0.09),
        },
        {
            "round_robin": _block(0.45, 0.11),
            "cache_aware": _block(0.85, 0.055),
            "kv_aware": _block(0.65, 0.085),
        },
    ]
    summary = bench.summarize(rounds, ["round_robin", "cache_aware", "kv_aware"])
    assert set(summary["policies"]) == {"round_robin", "cache_aware", "kv_aware"}
    assert "round_robin_over_round_robin" not in summary
    ca = summary["cache_aware_over_round_robin"]["hit_rate"]
    kv = summary["kv_aware_over_round_robin"]["hit_rate"]
    assert ca["ratio"] > kv["ratio"] > 1.0
    assert ca["ci95"][0] <= ca["ratio"] <= ca["ci95"][1]
    assert summary["cache_aware_over_round_robin"]["ttft_p50_s"]["ratio"] == pytest.approx(0.5)
    table = bench.table({"summary": summary, "rounds": rounds})
    assert "| kv_aware / round_robin | 3 |" in table


def test_kv_aware_gets_each_replicas_event_endpoint(bench: ModuleType) -> None:
    ports = bench.kv_event_ports(["round_robin", "kv_aware"], 2)
    assert len(set(ports)) == 2
    assert bench.kv_event_ports(["round_robin", "cache_aware"], 2) == []
    flag, config = bench.kv_events_engine_args(ports[0])
    assert flag == "--kv-events-config"
    assert json.loads(config) == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{ports[0]}",
    }
    args = bench.kv_aware_router_args(["http://a:1", "http://b:2"], ports, 128, "ministream")
    assert args[:4] == [
        "--kv-event-source",
        f"http://a:1=tcp://127.0.0.1:{ports[0]}",
        "--kv-event-source",
        f"http://b:2=tcp://127.0.0.1:{ports[1]}",
    ]
    assert args[4:] == ["--kv-event-block-size", "128", "--kv-event-model", "ministream"]


def test_a_chat_resends_its_history(bench: ModuleType) -> None:
    w = bench.Workload(2, 2, 3, 10, 4, 5, 4.0)
    chats = bench.chats(w, seed=1)
    assert len(chats) == 4 and all(len(turns) == 3 for turns in chats)
    for turns in chats:
        assert turns[1].startswith(turns[0]) and turns[2].startswith(turns[1])
    # Users 0 and 2 share system prompt 0; users 0 and 1 do not share one.
    assert chats[0][0].split("\n")[0] == chats[2][0].split("\n")[0]
    assert chats[0][0].split("\n")[0] != chats[1][0].split("\n")[0]
    plan = bench.order(w, seed=1)
    assert sorted(plan) == sorted((u, t) for u in range(4) for t in range(3))
    assert [t for _, t in plan] == sorted(t for _, t in plan)  # turn-major


def test_router_decisions_are_summed_by_outcome(bench: ModuleType) -> None:
    page = "\n".join(
        [
            f"# TYPE {bench.DECISIONS} counter",
            f'{bench.DECISIONS}{{outcome="hit",worker="a"}} 3',
            f'{bench.DECISIONS}{{outcome="hit",worker="b"}} 2',
            f'{bench.DECISIONS}{{outcome="miss"}} 1',
            'vllm_router_requests_total{outcome="hit"} 9',
        ]
    )
    assert bench.decisions(page) == {"hit": 5.0, "miss": 1.0}
