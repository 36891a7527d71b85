"""Every result under docs/results/ says where it came from (docs/benchmarks.md, "How results
are recorded"): a whole provenance block (commit, dirty tree, command, machine, versions;
bytecode on a GPU machine), or, for a file written before results carried one, an entry in
docs/results/provenance-notes.json saying what is missing and what is known.

Only JSON files are results here; logs and text files beside them are not checked. Fast: reads
files, runs `git log` once; starts no engine.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ministream_testkit import provenance
from ministream_testkit.provenance import KEY, collect, problems, sidecar_path, write_sidecar
from ministream_testkit.results import stamp_file, write_json

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
NOTES_NAME = "provenance-notes.json"
# The fields a note may say are missing: the block's required ones, by the names missing() uses.
NOTE_FIELDS = {
    *provenance.REQUIRED,
    *(f"machine.{f}" for f in provenance.MACHINE_REQUIRED),
    "bytecode",
}
RUN_FIELDS = ("date", "machine", "software", "command", "commit", "source")
COMMIT = "0123456789abcdef0123456789abcdef01234567"
HEX40 = re.compile(r"[0-9a-f]{40}")


def result_files(results: Path) -> list[Path]:
    """The JSON results under `results`: all but the notes index and the sidecar blocks
    (a sidecar is checked as its result's block)."""
    return [
        p
        for p in sorted(results.rglob("*.json"))
        if p.name != NOTES_NAME and not p.name.endswith(provenance.SIDECAR_SUFFIX)
    ]


def block_problems(path: Path) -> list[str]:
    """Why `path` has no whole provenance block (empty: it has one)."""
    data = json.loads(path.read_text())
    if isinstance(data, dict):
        return problems(data[KEY]) if KEY in data else ["no provenance block"]
    sidecar = sidecar_path(path)
    if not sidecar.is_file():
        return [f"a JSON {type(data).__name__}, and no {sidecar.name} beside it"]
    return [f"{sidecar.name}: {p}" for p in problems(json.loads(sidecar.read_text()).get(KEY))]


def audit(root: Path, results: Path) -> list[str]:
    """Every way the result files under `results` and the notes index disagree with the rule."""
    notes_path = results / NOTES_NAME
    notes: dict[str, Any] = json.loads(notes_path.read_text()) if notes_path.is_file() else {}
    files, runs = notes.get("files", {}), notes.get("runs", {})
    found = []
    for path in result_files(results):
        rel = path.relative_to(root).as_posix()
        gaps = block_problems(path)
        if gaps and rel not in files:
            found.append(f"{rel}: {'; '.join(gaps)} (and no entry in {NOTES_NAME})")
        elif not gaps and rel in files:
            found.append(f"{rel}: has a whole provenance block now; remove its note")
    for sidecar in sorted(results.rglob(f"*{provenance.SIDECAR_SUFFIX}")):
        result = sidecar.with_name(sidecar.name.removesuffix(provenance.SIDECAR_SUFFIX) + ".json")
        if not result.is_file():
            found.append(f"{sidecar.relative_to(root).as_posix()}: no {result.name} beside it")
    for rel, note in files.items():
        if not (root / rel).is_file():
            found.append(f"{NOTES_NAME} names {rel}, which does not exist")
        found += [f"{rel}'s note: {p}" for p in note_problems(note, runs)]
    for name, run in runs.items():
        found += [f"run {name}: no {f!r}" for f in RUN_FIELDS if not run.get(f)]
    return found


def note_problems(note: dict[str, Any], runs: dict[str, Any]) -> list[str]:
    found = []
    if note.get("run") not in runs:
        found.append(f"run {note.get('run')!r} is not in the index's runs")
    missing = note.get("missing")
    if not missing or not isinstance(missing, list):
        found.append("says nothing is missing: a file that lacks nothing needs a block, not a note")
    else:
        found += [f"{f!r} is not a field of the block" for f in missing if f not in NOTE_FIELDS]
    if not HEX40.fullmatch(str(note.get("added_in", ""))):
        found.append("added_in is not a 40-hex commit")
    if not note.get("recorded"):
        found.append("does not say what the file itself records")
    return found


def whole_block() -> dict[str, Any]:
    """A block as a run writes it, with the commit a GPU host would be given."""
    block = collect(["make", "bench-x"])
    block.update(commit=COMMIT, dirty=False)
    return block


def test_every_result_file_has_a_whole_block_or_a_note() -> None:
    found = audit(ROOT, RESULTS)
    assert not found, "\n".join(found)


def test_notes_name_the_commit_that_added_each_file() -> None:
    """The index's added_in is git's own answer, so a note cannot drift from history."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("no git checkout")
    if (ROOT / ".git" / "shallow").exists():
        pytest.skip("shallow clone: the commits that added older files are not here")
    log = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=commit %H", "--name-only", "--", "docs/"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    ).stdout
    added: dict[str, str] = {}
    commit = ""
    for line in log.splitlines():
        if line.startswith("commit "):
            commit = line.split()[1]
        elif line.strip():
            added[line.strip()] = commit  # newest first: the first add is the last one seen
    notes = json.loads((RESULTS / NOTES_NAME).read_text())["files"]
    wrong = {
        rel: (note["added_in"], added.get(rel))
        for rel, note in notes.items()
        if rel in added and note["added_in"] != added[rel]
    }
    assert not wrong, wrong


def test_a_written_block_is_whole_and_the_check_fails_without_each_field() -> None:
    block = whole_block()
    assert problems(block) == []
    for field in provenance.REQUIRED:
        cut = {k: v for k, v in block.items() if k != field}
        assert field in problems(cut), field
        assert field in problems({**block, field: None}), field
    for field in provenance.MACHINE_REQUIRED:
        host = {k: v for k, v in block["machine"].items() if k != field}
        assert f"machine.{field}" in problems({**block, "machine": host}), field
    assert problems({**block, "commit": "abc1234"}) == ["commit: 'abc1234' is not a 40-hex commit"]
    assert problems({**block, "dirty": "no"}) == ["dirty: 'no' is not true/false"]
    assert problems(None) == ["no provenance block (a NoneType)"]


def test_a_gpu_block_must_say_whether_bytecode_was_present() -> None:
    h200 = {"name": "NVIDIA H200", "memory": "143771 MiB", "driver": "580.159.04"}
    block = whole_block()
    block["machine"] = {**block["machine"], "gpu": [h200]}
    assert problems(block) == []
    assert problems({k: v for k, v in block.items() if k != "bytecode"}) == ["bytecode"]
    cpu = {k: v for k, v in whole_block().items() if k != "bytecode"}
    assert problems(cpu) == []  # no GPU: bytecode is recorded but not required


def test_the_audit_reports_each_kind_of_bad_file_and_stale_note(tmp_path: Path) -> None:
    """A tree with one file of each kind: the audit names exactly the bad ones."""
    results = tmp_path / "docs" / "results"
    (results / "run").mkdir(parents=True)
    whole = {KEY: whole_block(), "figure": 1.0}
    cut = {KEY: {k: v for k, v in whole_block().items() if k != "command"}, "figure": 2.0}

    def put(name: str, data: Any) -> None:
        (results / "run" / name).write_text(json.dumps(data))

    put("whole.json", whole)
    put("field-removed.json", cut)
    put("no-block.json", {"figure": 3.0})
    put("golden.json", [1, 2])  # a list: its block is the sidecar
    put("golden.provenance.json", {KEY: whole_block(), "of": "golden.json"})
    put("golden-alone.json", [3])
    put("orphan.provenance.json", {KEY: whole_block(), "of": "orphan.json"})
    put("old.json", {"figure": 4.0})
    put("noted-but-whole.json", whole)
    (results / "run" / "log.txt").write_text("not a result")
    note = {
        "run": "old-run",
        "added_in": COMMIT,
        "missing": ["commit"],
        "recorded": "nothing",
    }
    index = {
        "runs": {"old-run": dict.fromkeys(RUN_FIELDS, "known")},
        "files": {
            "docs/results/run/old.json": note,
            "docs/results/run/noted-but-whole.json": note,
            "docs/results/run/gone.json": note,
            "docs/results/run/no-block.json": {**note, "missing": ["the weather"]},
        },
    }
    (results / NOTES_NAME).write_text(json.dumps(index))

    found = audit(tmp_path, results)
    assert found == [
        "docs/results/run/field-removed.json: command (and no entry in provenance-notes.json)",
        "docs/results/run/golden-alone.json: a JSON list, and no golden-alone.provenance.json "
        "beside it (and no entry in provenance-notes.json)",
        "docs/results/run/noted-but-whole.json: has a whole provenance block now; remove its note",
        "docs/results/run/orphan.provenance.json: no orphan.json beside it",
        "provenance-notes.json names docs/results/run/gone.json, which does not exist",
        "docs/results/run/no-block.json's note: 'the weather' is not a field of the block",
    ]


def test_the_gpu_host_passes_commit_dirty_and_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINISTREAM_COMMIT", COMMIT)
    monkeypatch.setenv("MINISTREAM_DIRTY", "1")
    monkeypatch.setenv("MINISTREAM_COMMAND", "make bench-overload")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("MINISTREAM_SIDECAR_DRAIN_TOKEN", "s3cret")
    monkeypatch.setenv("VLLM_API_KEY", "s3cret")
    block = collect()
    assert (block["commit"], block["dirty"], block["command"]) == (
        COMMIT,
        True,
        "make bench-overload",
    )
    assert block["argv"]  # the process's own command line, beside the one a person ran
    assert block["environment"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "s3cret" not in json.dumps(block)
    assert "MINISTREAM_COMMIT" not in block["environment"]
    assert problems(block) == []
    monkeypatch.delenv("MINISTREAM_DIRTY")
    assert problems(collect()) == ["dirty"]  # a commit without saying whether the tree was dirty


def test_reports_and_raw_engine_results_are_stamped(tmp_path: Path) -> None:
    """ministream-loadtest's reports (SLO, rollout, overload, soak) and the benchmark scripts'
    results go through write_json; the load engine's raw results through stamp_file, which
    keeps them on one line."""
    report = tmp_path / "sub" / "report.json"
    write_json(report, {"sent": 1})
    written = write_json(report, {"sent": 3})
    assert json.loads(report.read_text()) == written
    assert [p.name for p in report.parent.iterdir()] == ["report.json"]  # no temporary left
    assert list(written) == [KEY, "sent"] and set(written[KEY]) >= set(provenance.REQUIRED)

    raw = tmp_path / "raw.json"
    raw.write_text(json.dumps({"ttfts": [0.1, 0.2]}))
    stamped = stamp_file(raw)
    assert len(raw.read_text().splitlines()) == 1
    assert stamped["ttfts"] == [0.1, 0.2] and KEY in stamped
    assert stamp_file(raw)[KEY] == stamped[KEY]  # an existing block is kept


def test_a_list_result_gets_its_block_beside_it(tmp_path: Path) -> None:
    golden = tmp_path / "reference-seed.json"
    golden.write_text("[]")
    sidecar = write_sidecar(golden)
    assert sidecar == tmp_path / "reference-seed.provenance.json"
    assert json.loads(sidecar.read_text())["of"] == "reference-seed.json"
    assert KEY in json.loads(sidecar.read_text())
