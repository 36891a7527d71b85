"""Custom resources checked against their vendored upstream CRDs (tests/charts/crds).

What an API server does with a custom resource, done without one:

- the served version's `openAPIV3Schema`, with jsonschema: types, enums, patterns, ranges,
  required fields;
- unknown fields fail. A structural CRD schema makes the API server drop every field it does
  not list (and refuse it under `kubectl apply --validate=strict`, the default field
  validation of `kubectl` since 1.27), so here every object schema that lists `properties`
  gets `additionalProperties: false`, recursively, except where
  `x-kubernetes-preserve-unknown-fields: true` keeps unknown fields;
- `x-kubernetes-validations` (CEL) after schema defaulting: no CEL engine runs here, so every
  rule on a node the object populates needs a Python twin in `CEL_TWINS` (keyed by the rule's
  message, each written from the rule text printed next to it in the CRD). A rule without a
  twin fails the check, so a CRD update that adds one cannot pass silently.

`metadata` is only `type: object` in a CRD (the API server checks ObjectMeta itself): names
and labels are checked by the chart tests.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CRDS = Path(__file__).resolve().parent / "crds"
FILES = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh_scaledobjects.yaml",
    ("inference.networking.k8s.io/v1", "InferencePool"): (
        "inference.networking.k8s.io_inferencepools.yaml"
    ),
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "gateway.networking.k8s.io_httproutes.yaml",
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): (
        "leaderworkerset.x-k8s.io_leaderworkersets.yaml"
    ),
}
KINDS = {kind for _, kind in FILES}

Json = dict[str, Any]


@functools.cache
def crd_schema(api_version: str, kind: str) -> Json:
    """The openAPIV3Schema of the served version `api_version` of `kind`, as vendored."""
    crd = yaml.safe_load((CRDS / FILES[(api_version, kind)]).read_text())
    group, version = api_version.split("/")
    assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    assert served["served"], f"{api_version} {kind} is not served by the vendored CRD"
    schema: Json = served["schema"]["openAPIV3Schema"]
    return schema


def strict(schema: Any) -> Any:
    """A copy in which listed properties are the only ones allowed (structural pruning)."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def defaulted(schema: Json, value: Any) -> Any:
    """The object with the schema's defaults filled in, as the API server stores it."""
    if isinstance(value, dict):
        out = dict(value)
        for key, sub in schema.get("properties", {}).items():
            if key not in out and "default" in sub:
                out[key] = copy.deepcopy(sub["default"])
            if key in out:
                out[key] = defaulted(sub, out[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in set(out) - set(schema.get("properties", {})):
                out[key] = defaulted(extra, out[key])
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [defaulted(schema["items"], v) for v in value]
    return value


def _nodes(schema: Json, value: Any, path: str) -> Iterator[tuple[Json, Any, str]]:
    """Every (schema, value, path) the object populates."""
    yield schema, value, path
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key, sub in value.items():
            if key in props:
                yield from _nodes(props[key], sub, f"{path}.{key}")
            elif isinstance(schema.get("additionalProperties"), dict):
                yield from _nodes(schema["additionalProperties"], sub, f"{path}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, sub in enumerate(value):
            yield from _nodes(schema["items"], sub, f"{path}[{i}]")


# ---------------------------------------------------------------- CEL twins


def _same_parent(a: Json, b: Json) -> bool:
    # `__namespace__` in the rule is the field `namespace` (CEL escapes the keyword).
    return (
        a.get("group") == b.get("group")
        and a.get("kind") == b.get("kind")
        and a.get("name") == b.get("name")
        and (a.get("namespace") or "") == (b.get("namespace") or "")
    )


def _prefix_rewrite(filters: list[Json], kind: str) -> bool:
    """Exactly one filter of `kind` replaces the path prefix."""
    hits = [
        f
        for f in filters
        if kind in f
        and f[kind].get("path", {}).get("type") == "ReplacePrefixMatch"
        and "replacePrefixMatch" in f[kind].get("path", {})
    ]
    return len(hits) == 1


def _one_prefix_match(rule: Json) -> bool:
    matches = rule.get("matches", [])
    return len(matches) == 1 and matches[0].get("path", {}).get("type") == "PathPrefix"


def _backend_prefix_rewrite(rule: Json, kind: str) -> bool:
    refs = rule.get("backendRefs", [])
    return sum(1 for b in refs if _prefix_rewrite(b.get("filters", []), kind)) == 1


_PATH_CHARS = re.compile(r"^(?:[-A-Za-z0-9/._~!$&'()*+,;=:@]|[%][0-9a-fA-F]{2})+$")


def _path_rule(check: Callable[[str], bool]) -> Callable[[Json], bool]:
    return lambda p: p["type"] not in ("Exact", "PathPrefix") or check(p["value"])


_DURATION_PART = re.compile(r"([0-9]+)(h|ms|m|s)")
_DURATION_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def _duration(text: str) -> float:
    """A Gateway API duration (GEP-2257, e.g. `1h30m`, `500ms`) in seconds."""
    return sum(int(n) * _DURATION_UNIT[u] for n, u in _DURATION_PART.findall(text))


def _backend_within_request(t: Json) -> bool:
    return not (
        "request" in t
        and "backendRequest" in t
        and _duration(t["request"]) != 0
        and _duration(t["backendRequest"]) > _duration(t["request"])
    )


CEL_TWINS: dict[str, Callable[[Any], bool]] = {
    # keda.sh ScaledObject .spec
    "minReplicaCount must be less than or equal to maxReplicaCount": lambda s: (
        "minReplicaCount" not in s or s["minReplicaCount"] <= s.get("maxReplicaCount", 100)
    ),
    # InferencePool .spec.endpointPickerRef, .spec.targetPorts
    "port is required when kind is 'Service' or unspecified (defaults to 'Service')": lambda r: (
        r.get("kind") != "Service" or "port" in r
    ),
    "port number must be unique": lambda ports: len({p["number"] for p in ports}) == len(ports),
    # HTTPRoute .spec.parentRefs
    "sectionName must be specified when parentRefs includes 2 or more references to the same "
    "parent": lambda refs: all(
        not _same_parent(a, b) or (not a.get("sectionName")) == (not b.get("sectionName"))
        for a in refs
        for b in refs
    ),
    "sectionName must be unique when parentRefs includes 2 or more references to the same "
    "parent": lambda refs: all(
        sum(
            1
            for b in refs
            if _same_parent(a, b) and (a.get("sectionName") or "") == (b.get("sectionName") or "")
        )
        == 1
        for a in refs
    ),
    # HTTPRoute .spec.rules[].timeouts
    "backendRequest timeout cannot be longer than request timeout": _backend_within_request,
    # HTTPRoute .spec.rules, .spec.rules[]
    "While 16 rules and 64 matches per rule are allowed, the total number of matches across all "
    "rules in a route must be less than 128": lambda rules: (
        sum(len(r.get("matches", [])) for r in rules[:16]) <= 128
    ),
    "RequestRedirect filter must not be used together with backendRefs": lambda r: (
        not r.get("backendRefs") or all("requestRedirect" not in f for f in r.get("filters", []))
    ),
    "When using RequestRedirect filter with path.replacePrefixMatch, exactly one PathPrefix "
    "match must be specified": lambda r: (
        not _prefix_rewrite(r.get("filters", []), "requestRedirect") or _one_prefix_match(r)
    ),
    "When using URLRewrite filter with path.replacePrefixMatch, exactly one PathPrefix match "
    "must be specified": lambda r: (
        not _prefix_rewrite(r.get("filters", []), "urlRewrite") or _one_prefix_match(r)
    ),
    "Within backendRefs, when using RequestRedirect filter with path.replacePrefixMatch, exactly "
    "one PathPrefix match must be specified": lambda r: (
        not _backend_prefix_rewrite(r, "requestRedirect") or _one_prefix_match(r)
    ),
    "Within backendRefs, When using URLRewrite filter with path.replacePrefixMatch, exactly one "
    "PathPrefix match must be specified": lambda r: (
        not _backend_prefix_rewrite(r, "urlRewrite") or _one_prefix_match(r)
    ),
    # HTTPRoute .spec.rules[].backendRefs[]
    "Must have port for Service reference": lambda b: (
        not (b.get("group", "") == "" and b.get("kind") == "Service") or "port" in b
    ),
    # HTTPRoute .spec.rules[].matches[].path
    "value must be an absolute path and start with '/' when type one of ['Exact', "
    "'PathPrefix']": _path_rule(lambda v: v.startswith("/")),
    "must not contain '//' when type one of ['Exact', 'PathPrefix']": _path_rule(
        lambda v: "//" not in v
    ),
    "must not contain '/./' when type one of ['Exact', 'PathPrefix']": _path_rule(
        lambda v: "/./" not in v
    ),
    "must not contain '/../' when type one of ['Exact', 'PathPrefix']": _path_rule(
        lambda v: "/../" not in v
    ),
    "must not contain '%2f' when type one of ['Exact', 'PathPrefix']": _path_rule(
        lambda v: "%2f" not in v
    ),
    "must not contain '%2F' when type one of ['Exact', 'PathPrefix']": _path_rule(
        lambda v: "%2F" not in v
    ),
    "must not contain '#' when type one of ['Exact', 'PathPrefix']": _path_rule(
        lambda v: "#" not in v
    ),
    "must not end with '/..' when type one of ['Exact', 'PathPrefix']": _path_rule(
        lambda v: not v.endswith("/..")
    ),
    "must not end with '/.' when type one of ['Exact', 'PathPrefix']": _path_rule(
        lambda v: not v.endswith("/.")
    ),
    "type must be one of ['Exact', 'PathPrefix', 'RegularExpression']": lambda p: (
        p["type"] in ("Exact", "PathPrefix", "RegularExpression")
    ),
    "must only contain valid characters (matching "
    "^(?:[-A-Za-z0-9/._~!$&'()*+,;=:@]|[%][0-9a-fA-F]{2})+$) for types ['Exact', "
    "'PathPrefix']": _path_rule(lambda v: bool(_PATH_CHARS.match(v))),
}


def validate(doc: Json) -> list[str]:
    """Every violation of the vendored CRD by `doc`, as `path: message` lines."""
    schema = crd_schema(doc["apiVersion"], doc["kind"])
    errors = [
        f"${''.join(f'[{p}]' if isinstance(p, int) else f'.{p}' for p in e.absolute_path)}: "
        f"{e.message}"
        for e in jsonschema.Draft7Validator(strict(schema)).iter_errors(doc)
    ]
    for node, value, path in _nodes(schema, defaulted(schema, doc), "$"):
        for rule in node.get("x-kubernetes-validations", []):
            message = rule.get("message", rule["rule"])
            twin = CEL_TWINS.get(message)
            if twin is None:
                errors.append(f"{path}: CEL rule without a Python twin in crdkit: {rule['rule']}")
            elif not twin(value):
                errors.append(f"{path}: {message}")
    return errors
