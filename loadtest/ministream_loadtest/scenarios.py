"""Load scenarios: YAML files, one workload shape and sweep each.

The bundled ones are package data (`ministream_loadtest/scenario_files/`, read through
`importlib.resources`, so a wheel finds them as a checkout does); `--scenario` takes their
name or the path of any file of the same form.

A scenario file (all keys shown; `description`, `range_ratio`, `temperature` optional):

    name: short-chat
    description: Short chat turns through /v1/chat/completions.
    api: chat                 # chat (/v1/chat/completions) or completions (/v1/completions)
    input_tokens: 64          # prompt length (random token text, the engine's `random` dataset)
    output_tokens: 64         # generated tokens (ignore_eos, so exactly this many)
    range_ratio: 0.25         # lengths drawn from [len*(1-r), len*(1+r)]; or {input: r, output: r}
    requests: 30              # requests per sweep point
    sweep:
      mode: rate              # rate: Poisson arrivals at N req/s; concurrency: N in flight
      values: [0.5, 1, 2]
    slo:                      # per-request objectives (ms) for goodput; any subset
      ttft_ms: 1000
      tpot_ms: 150
      e2el_ms: 15000
      attainment: 0.95        # a sweep point passes when this share of sent requests is good
    temperature: 0
    mix:                      # optional: an adapter mix, `model` of each request by share
      base: 2                 # `base` is the served model; other keys are LoRA adapter names
      support: 1
      legal: 1

With `mix`, each sweep point runs one engine per entry at the same time, each with its share
of the requests and of the rate (Poisson streams add up to one at the whole rate) or
concurrency, and the report has one entry per model: the SLO report per adapter.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml

from .engine import Api, LoadSpec, Slo

if TYPE_CHECKING:  # importlib.resources.abc is 3.11+; annotations only
    from importlib.resources.abc import Traversable

BUNDLED_PACKAGE = "ministream_loadtest"
BUNDLED_FOLDER = "scenario_files"
SweepMode = Literal["rate", "concurrency"]
_KEYS = {
    "name",
    "description",
    "api",
    "input_tokens",
    "output_tokens",
    "range_ratio",
    "requests",
    "sweep",
    "slo",
    "temperature",
    "mix",
}
BASE_MODEL = "base"  # the served model's key in `mix`
_SLO_KEYS = {"ttft_ms", "tpot_ms", "e2el_ms", "attainment"}


@dataclass(frozen=True)
class Sweep:
    mode: SweepMode
    values: tuple[float, ...]


@dataclass(frozen=True)
class Scenario:
    name: str
    api: Api
    input_tokens: int
    output_tokens: int
    requests: int
    sweep: Sweep
    slo: Slo = field(default_factory=Slo)
    attainment: float = 0.95
    range_ratio: float | dict[str, float] = 0.0
    temperature: float | None = 0.0
    description: str = ""
    path: str = ""
    mix: tuple[tuple[str, float], ...] = ()  # (model, share), shares summing to 1

    @property
    def max_tokens_per_request(self) -> int:
        """Longest prompt + generation the scenario can draw (must fit --max-model-len)."""
        ratio_in = ratio_out = self.range_ratio
        if isinstance(self.range_ratio, dict):
            ratio_in = self.range_ratio.get("input", 0.0)
            ratio_out = self.range_ratio.get("output", 0.0)
        assert isinstance(ratio_in, float) and isinstance(ratio_out, float)
        return int(self.input_tokens * (1 + ratio_in)) + int(self.output_tokens * (1 + ratio_out))

    def with_overrides(
        self,
        *,
        requests: int | None = None,
        sweep: Sweep | None = None,
        slo: Slo | None = None,
        attainment: float | None = None,
    ) -> Scenario:
        return replace(
            self,
            requests=requests if requests is not None else self.requests,
            sweep=sweep if sweep is not None else self.sweep,
            slo=slo if slo is not None else self.slo,
            attainment=attainment if attainment is not None else self.attainment,
        )

    def load_spec(
        self, value: float, *, base_url: str, model: str, tokenizer: str, seed: int = 0
    ) -> LoadSpec:
        """The engine run for one sweep point."""
        rate = value if self.sweep.mode == "rate" else None
        concurrency = int(value) if self.sweep.mode == "concurrency" else None
        return LoadSpec(
            base_url=base_url,
            model=model,
            tokenizer=tokenizer,
            api=self.api,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            range_ratio=self.range_ratio,
            num_prompts=self.requests,
            request_rate=rate,
            max_concurrency=concurrency,
            seed=seed,
            temperature=self.temperature,
            slo=self.slo,
            request_id_prefix=f"{self.name}-{self.sweep.mode}{value:g}-",
            label=self.name,
        )

    def mix_specs(
        self, value: float, *, base_url: str, model: str, tokenizer: str, seed: int = 0
    ) -> list[tuple[str, LoadSpec]]:
        """One engine run per entry of `mix` for one sweep point: (model, spec)."""
        whole = self.load_spec(value, base_url=base_url, model=model, tokenizer=tokenizer)
        out = []
        for k, (name, share) in enumerate(self.mix):
            served = model if name == BASE_MODEL else name
            out.append(
                (
                    served,
                    replace(
                        whole,
                        model=served,
                        num_prompts=max(1, round(self.requests * share)),
                        request_rate=None if whole.request_rate is None else value * share,
                        max_concurrency=None
                        if whole.max_concurrency is None
                        else max(1, round(value * share)),
                        seed=seed + k,
                        request_id_prefix=f"{whole.request_id_prefix}{name}-",
                    ),
                )
            )
        return out


def _require(cond: bool, path: Traversable, message: str) -> None:
    if not cond:
        raise ValueError(f"scenario {path}: {message}")


def _positive_int(data: dict[str, Any], key: str, path: Traversable) -> int:
    value = data.get(key)
    _require(
        isinstance(value, int) and not isinstance(value, bool) and value > 0,
        path,
        f"{key} must be a positive integer, got {value!r}",
    )
    return int(value)  # type: ignore[arg-type]


def _ratio(value: Any, path: Traversable) -> float | dict[str, float]:
    def ok(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < 1

    if isinstance(value, dict):
        _require(
            set(value) <= {"input", "output"} and all(ok(v) for v in value.values()),
            path,
            "range_ratio must map input/output to numbers in [0, 1)",
        )
        return {k: float(v) for k, v in value.items()}
    _require(ok(value), path, f"range_ratio must be in [0, 1), got {value!r}")
    return float(value)


def load_scenario(path: Traversable) -> Scenario:
    data = yaml.safe_load(path.read_text())
    _require(isinstance(data, dict), path, "must be a YAML mapping")
    unknown = set(data) - _KEYS
    _require(not unknown, path, f"unknown keys {sorted(unknown)}")
    name = data.get("name")
    _require(
        isinstance(name, str) and name.replace("-", "").isalnum(),
        path,
        f"name must be letters, digits and dashes, got {name!r}",
    )
    api = data.get("api", "completions")
    _require(api in ("completions", "chat"), path, f"api must be chat or completions, not {api!r}")
    sweep = _sweep(data.get("sweep"), path)
    slo, attainment = _slo(data.get("slo") or {}, path)
    temperature = data.get("temperature", 0.0)
    _require(
        temperature is None or isinstance(temperature, (int, float)),
        path,
        "temperature must be a number",
    )
    mix = _mix(data.get("mix") or {}, path)
    return Scenario(
        name=name,
        api=api,
        input_tokens=_positive_int(data, "input_tokens", path),
        output_tokens=_positive_int(data, "output_tokens", path),
        requests=_positive_int(data, "requests", path),
        sweep=sweep,
        slo=slo,
        attainment=attainment,
        range_ratio=_ratio(data.get("range_ratio", 0.0), path),
        temperature=None if temperature is None else float(temperature),
        description=str(data.get("description", "")),
        path=str(path),
        mix=mix,
    )


def _is_positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _sweep(sweep: Any, path: Traversable) -> Sweep:
    _require(
        isinstance(sweep, dict) and set(sweep) == {"mode", "values"},
        path,
        "sweep must have exactly `mode` and `values`",
    )
    mode = sweep["mode"]
    _require(
        mode in ("rate", "concurrency"),
        path,
        f"sweep.mode must be rate or concurrency, not {mode!r}",
    )
    values = sweep["values"]
    _require(
        isinstance(values, list) and bool(values) and all(map(_is_positive_number, values)),
        path,
        "sweep.values must be a non-empty list of positive numbers",
    )
    if mode == "concurrency":
        _require(
            all(float(v).is_integer() for v in values),
            path,
            "concurrency sweep values must be whole numbers",
        )
    return Sweep(mode=mode, values=tuple(float(v) for v in values))


def _slo(slo: Any, path: Traversable) -> tuple[Slo, float]:
    """The per-request objectives, and the share of requests that must meet them."""
    _require(
        isinstance(slo, dict) and set(slo) <= _SLO_KEYS,
        path,
        f"slo keys must be among {sorted(_SLO_KEYS)}",
    )
    for key in ("ttft_ms", "tpot_ms", "e2el_ms"):
        _require(
            slo.get(key) is None or (isinstance(slo[key], (int, float)) and slo[key] > 0),
            path,
            f"slo.{key} must be a positive number",
        )
    attainment = slo.get("attainment", 0.95)
    _require(
        isinstance(attainment, (int, float)) and 0 < attainment <= 1,
        path,
        "slo.attainment must be in (0, 1]",
    )
    objectives = Slo(
        ttft_ms=slo.get("ttft_ms"), tpot_ms=slo.get("tpot_ms"), e2el_ms=slo.get("e2el_ms")
    )
    return objectives, float(attainment)


def _mix(mix: Any, path: Traversable) -> tuple[tuple[str, float], ...]:
    """(model, share) for each entry of `mix`, the weights made shares summing to 1."""
    _require(
        isinstance(mix, dict)
        and all(isinstance(k, str) and k for k in mix)
        and all(map(_is_positive_number, mix.values())),
        path,
        "mix must map model names (`base` for the served model) to positive weights",
    )
    total = float(sum(mix.values())) if mix else 1.0
    return tuple((str(k), float(v) / total) for k, v in mix.items())


def shipped_scenarios() -> list[Traversable]:
    """The bundled scenario files, by name."""
    folder = files(BUNDLED_PACKAGE).joinpath(BUNDLED_FOLDER)
    found = [f for f in folder.iterdir() if f.is_file() and f.name.endswith(".yaml")]
    return sorted(found, key=lambda f: f.name)


def shipped_names() -> list[str]:
    return [f.name.removesuffix(".yaml") for f in shipped_scenarios()]


def resolve_scenario(ref: str) -> Traversable:
    """A scenario file path, or the name of a bundled one."""
    path = Path(ref)
    if path.is_file():
        return path
    for shipped in shipped_scenarios():
        if shipped.name == f"{ref}.yaml":
            return shipped
    names = ", ".join(shipped_names()) or "none"
    raise ValueError(f"no scenario file {ref!r} (bundled scenarios: {names})")
