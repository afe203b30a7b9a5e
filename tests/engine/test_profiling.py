"""Profiles of a job's artifacts (engine.profile.profiling, option `profile`, `report.profile`).

Timings on a shared machine are noise: these tests assert structure and relations (counts,
p50 ≤ p90, positive values, the budget's effect), never speeds.
"""

from __future__ import annotations

import dataclasses
import json
import platform
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch

from engine import targets
from engine.profile import profiling
from engine.targets import registry
from schemas import ExportOptions, ProfileOptions, ProfileReport, ReportDocument
from tests.engine.model_files import export_file
from tests.engine.test_targets import needs

MODEL = "profile_mlp.py"
SCHEMA = Path(__file__).parents[2] / "schemas" / "json" / "report.schema.json"


def export(tmp_path: Path, options: dict[str, Any] | None = None) -> Any:
    """The MLP exported with `options`; no round trip (a fresh interpreter per export)."""
    return export_file(tmp_path, MODEL, {"verify": {"roundtrip": False}, **(options or {})})


def thread_counts() -> list[int]:
    return sorted({1, torch.get_num_threads()})


def assert_measured(profile: ProfileReport, name: str, runs: int) -> None:
    [found] = [a for a in profile.artifacts if a.name == name]
    assert found.status == "measured" and found.error is None
    assert [latency.threads for latency in found.latency] == thread_counts()
    for latency in found.latency:
        assert latency.runs == runs and not latency.budget_reached
        assert latency.settings["torch.set_num_threads"] == latency.threads
        assert 0 < latency.min_ms <= latency.p50_ms <= latency.p90_ms <= latency.max_ms
        assert latency.min_ms <= latency.mean_ms <= latency.max_ms
    if found.kind == "eager":
        assert found.size is None and found.load_s is None and found.artifact is None
    else:
        assert found.size is not None and found.size > 0
        assert found.load_s is not None and found.load_s > 0
        assert all(latency.load_s is not None for latency in found.latency)
    if found.peak_rss_mb is not None:  # Linux
        assert found.peak_rss_mb > 0 and found.added_rss_mb is not None
        assert 0 <= found.added_rss_mb <= found.peak_rss_mb


def test_eager_program_and_each_target_are_profiled(tmp_path: Path) -> None:
    needs("onnx")
    result = export(tmp_path, {"targets": ["onnx"], "profile": {"runs": 5, "warmup": 1}})
    report = result.report
    assert result.succeeded and report.profile is not None
    profile = report.profile
    assert [a.name for a in profile.artifacts] == ["eager", "program", "onnx"]
    assert [a.kind for a in profile.artifacts] == ["eager", "program", "target"]
    for name in ("eager", "program", "onnx"):
        assert_measured(profile, name, runs=5)
    out = tmp_path / "out"
    sizes = {a.name: (a.artifact, a.files, a.size) for a in profile.artifacts}
    assert sizes["program"] == (
        "program.pt2",
        ["program.pt2"],
        (out / "program.pt2").stat().st_size,
    )
    assert sizes["onnx"] == ("model.onnx", ["model.onnx"], (out / "model.onnx").stat().st_size)
    onnx = profile.artifacts[2]
    assert all(
        latency.settings["onnxruntime.intra_op_num_threads"] == latency.threads
        for latency in onnx.latency
    )
    assert (profile.runs, profile.warmup, profile.budget_s) == (5, 1, 30.0)
    assert profile.duration_s > 0
    machine = profile.machine
    assert machine.threads == torch.get_num_threads()
    assert machine.architecture == platform.machine() and machine.device == "cpu"
    assert machine.cpus is not None and machine.cpus >= 1
    if platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64"):
        assert machine.cpu  # /proc/cpuinfo's model name
        assert ("avx2" in machine.isa) == torch.cpu._is_avx2_supported()
    # Its own stage, after converting, and the report's JSON Schema knows the section.
    assert [s.name for s in report.stages][-2:] == ["converting", "profiling"]
    document = json.loads((out / "report.json").read_text())
    jsonschema.validate(document, json.loads(SCHEMA.read_text()))
    assert ReportDocument.model_validate(document).profile == profile


def test_the_budget_stops_the_runs_early_and_says_how_many_were_made(tmp_path: Path) -> None:
    # 1 µs: a quarter of it per measurement is shorter than any run (1 ms once let a fast
    # MLP run twice in its 0.25 ms share); the report rounds the budget to the millisecond
    result = export(
        tmp_path, {"profile": {"enabled": True, "runs": 50, "warmup": 3, "budget_s": 1e-6}}
    )
    profile = result.report.profile
    assert result.succeeded and profile is not None
    assert profile.budget_s == 0 and profile.runs == 50
    assert [a.name for a in profile.artifacts] == ["eager", "program"]
    for artifact in profile.artifacts:
        assert artifact.status == "measured"
        for latency in artifact.latency:
            # The first warm-up and the first timed run are always made, no more.
            assert (latency.warmup, latency.runs, latency.budget_reached) == (1, 1, True)
            assert latency.p50_ms == latency.p90_ms == latency.min_ms > 0


def test_the_budget_is_at_most_half_of_what_the_timeout_leaves() -> None:
    options = ExportOptions.model_validate({"timeout_s": 100, "profile": {"budget_s": 30}})
    assert profiling.budget(options, elapsed_s=10) == 30
    assert profiling.budget(options, elapsed_s=60) == 20
    assert profiling.budget(options, elapsed_s=120) == 0


def test_profiles_are_on_by_default_only_with_targets() -> None:
    assert not profiling.wanted(ExportOptions())
    assert profiling.wanted(ExportOptions(targets=["onnx"]))
    assert profiling.wanted(ExportOptions.model_validate({"profile": {"enabled": True}}))
    assert not profiling.wanted(
        ExportOptions.model_validate({"targets": ["onnx"], "profile": {"enabled": False}})
    )


def without(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Target `name` fails at once: the worker "lacks" its packages."""
    row = dataclasses.replace(registry.TARGETS[name], requires=("torchport_no_such_module",))
    monkeypatch.setitem(registry.TARGETS, name, row)


def test_no_profile_without_targets_or_when_turned_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = export(tmp_path / "plain")
    assert plain.succeeded and plain.report.profile is None
    assert "profiling" not in [s.name for s in plain.report.stages]
    without(monkeypatch, "onnx")
    off = export(tmp_path / "off", {"targets": ["onnx"], "profile": {"enabled": False}})
    assert off.succeeded and off.report.profile is None
    assert "profiling" not in [s.name for s in off.report.stages]


def test_a_failed_target_has_no_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    without(monkeypatch, "onnx")
    result = export(tmp_path, {"targets": ["onnx"], "profile": {"runs": 2}})
    assert result.succeeded and result.report.targets["onnx"].status == "failed"
    profile = result.report.profile
    assert profile is not None
    assert [a.name for a in profile.artifacts] == ["eager", "program"]
    assert_measured(profile, "program", runs=2)


def tiny_subjects(tmp_path: Path) -> tuple[list[profiling.Subject], Path]:
    module = torch.nn.Linear(4, 2).eval()
    args = (torch.randn(3, 4),)
    path = tmp_path / "program.pt2"
    torch.export.save(torch.export.export(module, args), path)
    return [
        profiling.eager_subject(module, args, {}),
        profiling.program_subject(path, args, {}),
    ], path


def test_an_artifact_whose_runtime_raises_fails_only_its_own_profile(tmp_path: Path) -> None:
    subjects, path = tiny_subjects(tmp_path)

    def broken(threads: int) -> Any:
        raise RuntimeError("the runtime refused the artifact")

    subjects.insert(1, profiling.Subject("onnx", "target", "test", broken, (), {}, [path]))
    profile = profiling.profile(subjects, ProfileOptions(runs=3), budget_s=10)
    assert [(a.name, a.status) for a in profile.artifacts] == [
        ("eager", "measured"),
        ("onnx", "failed"),
        ("program", "measured"),
    ]
    failed = profile.artifacts[1]
    assert failed.latency == [] and failed.error is not None and "RuntimeError" in failed.error
    assert all(latency.runs == 3 for latency in profile.artifacts[2].latency)


def test_an_artifact_too_large_for_the_memory_left_is_not_loaded(tmp_path: Path) -> None:
    subjects, _ = tiny_subjects(tmp_path)
    profile = profiling.profile(subjects, ProfileOptions(runs=2), budget_s=10, memory_mb=1)
    eager, program = profile.artifacts
    if program.status == "measured":
        pytest.skip("this platform does not report resident memory (/proc)")
    assert eager.status == "measured"  # already in memory: nothing to load
    assert program.status == "skipped" and program.latency == [] and program.error
    assert program.size is not None and program.size > 0


@pytest.mark.slow
def test_every_target_is_profiled_with_its_runtimes_thread_setting(tmp_path: Path) -> None:
    for name in targets.ORDER:
        needs(name)
    result = export(tmp_path, {"targets": list(targets.ORDER), "profile": {"runs": 3, "warmup": 1}})
    profile = result.report.profile
    assert result.succeeded and profile is not None
    assert [a.name for a in profile.artifacts] == ["eager", "program", *targets.ORDER]
    for artifact in profile.artifacts:
        assert_measured(profile, artifact.name, runs=3)
    settings = {a.name: set(a.latency[0].settings) for a in profile.artifacts}
    assert settings["executorch"] == {"torch.set_num_threads", "executorch.threadpool"}
    assert settings["aoti"] == {"torch.set_num_threads"}
    assert result.report.targets["aoti"].details["threads"] == "dynamic"


class StaticCache(torch.nn.Module):
    """A program with its cache as state: writes the step's positions, records them."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(1, 64, 4))
        self.seen: list[tuple[tuple[int, ...], list[int]]] = []

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        self.seen.append((tuple(input_ids.shape), cache_position.tolist()))
        self.cache[:, cache_position] = input_ids.float().unsqueeze(-1).expand(-1, -1, 4)
        return self.cache.sum(-1)


def test_a_generation_ready_artifact_gets_decode_steps_at_a_short_and_a_long_position() -> None:
    model = StaticCache()
    prompt = {"input_ids": torch.arange(1, 17)[None], "cache_position": torch.arange(16)}
    subject = profiling.decoding(profiling.eager_subject(model, (), prompt), 64)
    assert subject.decode_positions == (8, 56)
    profile = profiling.profile([subject], ProfileOptions(runs=2, warmup=1), budget_s=10)
    [row] = profile.artifacts
    for latency in row.latency:
        assert [step.position for step in latency.decode] == [8, 56]
        assert all(step.runs == 2 for step in latency.decode)
    steps = [seen for seen in model.seen if seen[0] == (1, 1)]
    assert steps and {positions[0] for _, positions in steps} == {8, 56}
    prompts = [seen for seen in model.seen if seen[0] != (1, 1)]
    assert prompts[0] == ((1, 16), list(range(16)))
    # a big cache: the short position stays at 64
    assert profiling.decoding(subject, 1024).decode_positions == (64, 896)
    # an artifact taking neither cache_position nor its past gets none
    other = profiling.eager_subject(model, (), {"input_ids": prompt["input_ids"]})
    assert profiling.decoding(other, 64).decode_positions == ()


class WithPast(torch.nn.Module):
    """A model taking its past as inputs, as a generation-ready ONNX model does
    (`generation.onnx_past`): records each call's token count, mask, positions and past
    lengths."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, int, tuple[int, ...], frozenset[int]]] = []

    def forward(self, **feed: Any) -> torch.Tensor:
        past = [tensor for layer in feed["past_key_values"] for tensor in layer]
        assert {tensor.shape[:2] + tensor.shape[3:] for tensor in past} == {(1, 2, 8)}
        ids, mask, positions = feed["input_ids"], feed["attention_mask"], feed["position_ids"]
        assert mask.dtype == torch.long
        lengths = frozenset(tensor.shape[2] for tensor in past)
        self.seen.append((ids.shape[1], mask.shape[1], tuple(positions[0].tolist()), lengths))
        return ids.float()


def test_a_model_taking_its_past_as_inputs_gets_a_prefill_and_decode_steps() -> None:
    """An ONNX LLM's profile: the timed runs are the prompt's prefill with an empty past,
    the decode steps one token after a past of that many positions."""
    model = WithPast()
    past = [(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)) for _ in range(2)]
    example = {
        "input_ids": torch.tensor([[5, 6]]),
        "attention_mask": torch.ones(1, 5, dtype=torch.long),
        "position_ids": torch.tensor([[3, 4]]),
        "past_key_values": past,
    }
    subject = profiling.eager_subject(model, (), example)
    assert profiling.decoding(subject, 64).decode_positions == ()  # no prompt given
    subject = profiling.decoding(subject, 64, torch.arange(1, 17)[None])
    assert subject.decode_positions == (8, 56)
    profiling.profile([subject], ProfileOptions(runs=2, warmup=1), budget_s=10)
    prefills = {seen for seen in model.seen if seen[0] == 16}
    assert prefills == {(16, 16, tuple(range(16)), frozenset({0}))}
    steps = {(seen[1], seen[2][0], seen[3]) for seen in model.seen if seen[0] == 1}
    assert steps == {(9, 8, frozenset({8})), (57, 56, frozenset({56}))}
