"""The adapter-mix scenario: one engine stream per model, shares of requests and rate."""

from __future__ import annotations

from pathlib import Path

import pytest

from ministream_loadtest.scenarios import BASE_MODEL, load_scenario, resolve_scenario


def test_mix_splits_requests_and_rate_by_share() -> None:
    sc = load_scenario(resolve_scenario("adapter-mix"))
    shares = dict(sc.mix)
    assert sum(shares.values()) == pytest.approx(1) and BASE_MODEL in shares
    value = sc.sweep.values[-1]
    parts = sc.mix_specs(value, base_url="http://x", model="served", tokenizer="t", seed=7)
    models = [m for m, _ in parts]
    assert models == ["served" if k == BASE_MODEL else k for k in shares]
    for (name, spec), share in zip(parts, shares.values(), strict=True):
        assert spec.model == name
        assert spec.request_rate == pytest.approx(value * share)
        assert spec.num_prompts == round(sc.requests * share)
    assert sum(s.request_rate or 0 for _, s in parts) == pytest.approx(value)
    assert len({s.seed for _, s in parts}) == len(parts)  # no two streams replay one prompt set
    assert len({s.request_id_prefix for _, s in parts}) == len(parts)


def test_a_bad_mix_is_refused(tmp_path: Path) -> None:
    text = resolve_scenario("adapter-mix").read_text().replace("legal: 1", "legal: 0")
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match="mix must map model names"):
        load_scenario(path)
