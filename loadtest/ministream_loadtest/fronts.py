"""What stands in front of the rollout's pods and takes the load: `haproxy` (a Kubernetes
Service, haproxy.py) or `router` (vLLM's router with its discovery, router_front.py).

`Front` is what the rollout needs of either; `open_front` starts one with the first pods'
endpoints in it, not ready until their first passing probe.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from .chart_pod import ChartPod
from .haproxy import AccessLogEntry, HAProxy, Slot

if TYPE_CHECKING:
    from .router_front import Discovery

FrontKind = Literal["haproxy", "router"]


class Front(Protocol):
    name: str

    @property
    def url(self) -> str: ...

    def add_endpoint(self, slot: Slot) -> None: ...

    def remove_endpoint(self, slot: Slot) -> None: ...

    def mark_unready(self, slot: Slot) -> None: ...

    def states(self) -> dict[str, str]: ...

    def access_log(self) -> Mapping[str, AccessLogEntry] | None: ...

    def describe(self, t0: float) -> dict[str, Any]: ...

    def stop(self) -> None: ...


def front_chart_values(kind: FrontKind, router_policy: str | None = None) -> dict[str, Any]:
    """Chart values the front needs: the router's makes the chart render the router (its
    arguments) and what it adds to the serving pods' vLLM (e.g. cache_aware's
    --enable-scale-out)."""
    if kind != "router":
        return {}
    return {"router.enabled": True, **({"router.policy": router_policy} if router_policy else {})}


def open_front(
    kind: FrontKind,
    workdir: Path,
    slots: list[Slot],
    enabled: set[int],
    chart: ChartPod,
    discovery: Discovery = "worker-api",
    slot_labels: Mapping[int, dict[str, str]] | None = None,
) -> Front:
    """The front, started, with the `enabled` slots as endpoints not yet ready; `discovery`:
    how the router learns of them (router_front.Discovery); `slot_labels`: the pod labels of
    slots whose pods are not the chart's `pod_labels` (the other P/D pool's)."""
    if kind == "router":
        from .router_front import RouterFront

        router = RouterFront(
            workdir, slots, chart, discovery=discovery, slot_labels=dict(slot_labels or {})
        )
        try:
            router.start()
        except BaseException:
            router.stop()
            raise
        for i in sorted(enabled):
            router.add_endpoint(slots[i])
        return router
    haproxy = HAProxy(workdir, slots, enabled, chart).start()
    for i in sorted(enabled):
        haproxy.mark_unready(slots[i])
    return haproxy
