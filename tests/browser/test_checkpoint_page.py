"""The form and the job page with a Hugging Face checkpoint, in Chromium: the form shows a
checkpoint's fields (task, generation) instead of a module's, takes a dropped folder
whole, and the job page says what the export did (how it was traced, its outputs by name,
whole dim names, whether torch's warnings matter) and how long a stage has left."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.conftest import Server
from tests.browser.test_checkpoint_upload import finished
from tests.browser.test_pages import job_id_of

transformers = pytest.importorskip("transformers")

NOT_CUT = """(selector) => [...document.querySelectorAll(selector)]
  .filter((el) => el.scrollWidth > el.clientWidth).map((el) => el.value)"""


@pytest.mark.slow
def test_a_llama_folder_shows_its_fields_and_its_result_says_what_it_did(
    page: Any, server: Server, tmp_path: Path
) -> None:
    from tests.engine.test_generation import llama

    directory = llama(tmp_path)
    page.goto("/")
    page.set_input_files("[data-testid=folder-model]", str(directory))
    page.wait_for_selector("#task-row:not([hidden])")
    # a checkpoint has no module attribute, no code whose ops to keep, and a task's inputs
    assert page.is_hidden("#symbol-row") and page.is_hidden("#preserve-row")
    placeholder = json.loads(page.get_attribute("#dynamic-shapes", "placeholder") or "{}")
    assert "input_ids" in placeholder and "x" not in placeholder
    assert page.is_visible("#generation-fields")  # the task is inferred: it may generate
    page.select_option("#task", "fill-mask")
    assert page.is_hidden("#generation-fields")
    page.select_option("#task", "text-generation")
    page.fill("#max-cache-len", "32")
    page.fill("#max-new-tokens", "4")
    page.click("#submit")
    job = finished(server, job_id_of(page))
    assert job["status"] == "succeeded", job["error"]
    generation = job["options"]["generation"]
    assert (generation["cache"], generation["max_cache_len"], generation["max_new_tokens"]) == (
        None,  # the cache where transformers can give one: it could here (the report's)
        32,
        4,
    )
    report = server.api(f"v1/exports/{job['id']}/artifacts/report.json")
    signature = server.api(f"v1/exports/{job['id']}/artifacts/signature.json")
    assert report["generation"]["max_cache_len"] == 32
    assert report["generation"]["check"]["max_new_tokens"] == 4
    page.wait_for_selector(".generation-check", timeout=60_000)
    # every run of the check, not only the first: the second prompt and the restart
    runs = report["generation"]["check"]["runs"]
    assert [r["prompt"] for r in runs] == ["second", "example"]
    shown = page.locator("[data-card=generation] .generation-check li[data-run]")
    assert shown.evaluate_all("items => items.map((li) => li.dataset.run)") == ["second", "example"]
    assert shown.evaluate_all("items => items.map((li) => li.dataset.matched)") == [
        json.dumps(r["matched"]) for r in runs
    ]

    # the header says how it was traced as the report (and the summary) does
    fact = page.locator("[data-fact=tracing]")
    assert fact.get_attribute("data-source") == "report"
    assert fact.get_attribute("data-strict") == json.dumps(report["tracing"]["strict_used"])
    # the output by the name the report gives, not the graph node's
    names = page.locator("[data-card=summary] .io li[data-name]").evaluate_all(
        "items => items.map((li) => li.dataset.name)"
    )
    nodes = [o["name"] for o in signature["outputs"] if o["kind"] == "user_output"]
    assert report["generation"]["outputs"] == ["logits"]
    assert names[-len(nodes) :] == report["generation"]["outputs"]
    # dim names whole in the export-again editor
    page.wait_for_selector(".dim-name")
    values = page.locator(".dim-name").evaluate_all("inputs => inputs.map((i) => i.value)")
    assert "sequence_length" in values
    assert page.evaluate(NOT_CUT, ".dim-name") == []
    # each torch warning says whether it matters: this export verified and generated alike
    for item in page.locator("li[data-code=torch_warning]").all():
        assert item.get_attribute("data-matters") == "false"
        assert item.locator(".assessment").count() == 1


def _file_js(name: str, data: bytes) -> str:
    encoded = base64.b64encode(data).decode()
    return f"new File([Uint8Array.from(atob('{encoded}'), (c) => c.charCodeAt(0))], {name!r})"


def test_a_dropped_folder_is_zipped_whole(page: Any, server: Server, tmp_path: Path) -> None:
    """A folder dragged onto the model field arrives as a directory entry: every file below
    it is read (the checkpoint's files and its adapter sub-folder), not only the first."""
    torch = pytest.importorskip("torch")
    directory = tmp_path / "tiny-bert"
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
    )
    transformers.BertForMaskedLM(config).save_pretrained(directory)
    (directory / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    (directory / "README.md").write_text("# tiny-bert\n")  # left behind
    top = sorted(p for p in directory.iterdir() if p.is_file())
    files = ", ".join(f"file({_file_js(p.name, p.read_bytes())})" for p in top)
    page.goto("/")
    page.wait_for_selector("[data-zone=model]")
    page.evaluate(
        """() => {
          const file = (f) => ({ isFile: true, isDirectory: false, name: f.name,
            file: (ok) => ok(f) });
          const dir = (name, children) => ({ isFile: false, isDirectory: true, name,
            createReader() {
              let read = false;
              // as Chromium answers: a batch, then none
              return { readEntries(ok) { ok(read ? [] : children); read = true; } };
            } });
          const folder = dir("tiny-bert", [FILES]);
          const dataTransfer = { items: [{ kind: "file", webkitGetAsEntry: () => folder }],
            files: [new File([], "tiny-bert")] };
          const event = new Event("drop", { bubbles: true, cancelable: true });
          Object.defineProperty(event, "dataTransfer", { value: dataTransfer });
          document.querySelector("[data-zone=model]").dispatchEvent(event);
        }""".replace("FILES", files)
    )
    page.wait_for_selector("#task-row:not([hidden])")
    assert page.text_content("[data-zone=model] .file-name") == "tiny-bert.zip"
    sent = page.text_content("#folder-status") or ""
    assert "config.json" in sent and "model.safetensors" in sent and "vocab.txt" in sent
    assert "README.md" not in sent
    page.select_option("#task", "fill-mask")
    page.click("#submit")
    job_id = job_id_of(page)
    # what the server got: the folder's files, byte for byte
    for name in ("config.json", "model.safetensors", "vocab.txt"):
        stored = httpx.get(
            f"{server.url}v1/exports/{job_id}/uploads/model/files/tiny-bert/{name}", timeout=10
        )
        assert stored.status_code == 200, stored.text
        assert stored.content == (directory / name).read_bytes()
    httpx.delete(f"{server.url}v1/exports/{job_id}", timeout=10)


def test_a_stage_past_its_estimate_says_so_instead_of_no_time_left(page: Any) -> None:
    page.goto("/")
    shown = page.evaluate(
        """async () => {
          const m = await import('./web/job.js');
          const label = (e) => { const el = m.estimateLabel(e); return {...el.dataset}; };
          return [label({fraction: 0.8, left: 0}), label({fraction: 0.8, left: 0.3}),
                  label({fraction: 0.5, left: 5.2})];
        }"""
    )
    assert shown == [{"overdue": "true"}, {"overdue": "true"}, {"left": "5"}]


def test_the_header_says_how_the_report_traced_it(page: Any) -> None:
    page.goto("/")
    facts = page.evaluate(
        """async () => {
          const m = await import('./web/job.js');
          const job = {options: {strict: false}};
          return [m.tracingFact(job, null), m.tracingFact(job, {tracing: {strict_used: true}}),
                  m.tracingFact({options: {strict: "auto"}}, {tracing: {strict_used: false}})];
        }"""
    )
    assert [(f["source"], f["strict"]) for f in facts] == [
        ("options", False),
        ("report", True),
        ("report", False),
    ]


EXECUTORCH_BUFFERS = (
    "Mutation on a buffer in the model is detected. ExecuTorch assumes buffers that are "
    "mutated in the graph have a meaningless initial state, only the shape and dtype will "
    "be serialized."
)


def test_a_torch_warning_says_whether_it_matters(page: Any) -> None:
    page.goto("/")
    cases = page.evaluate(
        """async (text) => {
          const m = await import('./web/warnings_card.js');
          const warning = (message) => ({code: "torch_warning", message, details: {}});
          const verified = {verdict: "verified", passed: true, enabled: true, samples: []};
          const target = (matched) => ({executorch: {status: "succeeded",
            generation: {matched}}});
          const reports = [
            {verification: verified, generation: {check: {matched: true}},
             targets: target(true)},
            {verification: verified, generation: {check: {matched: true}},
             targets: target(false)},
          ];
          const assess = (w, r) => { const a = m.assessWarning(w, r);
            return [a.matters, a.known]; };
          return [
            assess(warning(text), reports[0]), assess(warning(text), reports[1]),
            assess(warning("something torch said"), {verification: verified}),
            assess(warning("something torch said"),
                   {verification: {verdict: "failed", passed: false}}),
            assess(warning("something torch said"), {verification: null}),
            assess({code: "partially_verified", message: "m"}, {verification: verified}),
          ];
        }""",
        EXECUTORCH_BUFFERS,
    )
    assert cases == [
        [False, "executorch_buffer_initial_state"],
        [True, "executorch_buffer_initial_state"],
        [False, None],
        [True, None],
        [None, None],
        [None, None],
    ]


def test_dim_names_are_never_cut(page: Any) -> None:
    page.goto("/")
    page.wait_for_selector("main")
    page.evaluate(
        """async () => {
          const m = await import('./web/dynamic_shapes.js');
          const editor = m.dimensionEditor([{name: "input_ids", shape: [1, 16]}], () => {},
            {input_ids: {"1": {name: "encoder_sequence_length", min: 1, max: 64}}});
          document.querySelector("main").append(editor);
        }"""
    )
    values = page.locator(".dim-name").evaluate_all("inputs => inputs.map((i) => i.value)")
    assert "encoder_sequence_length" in values
    assert page.evaluate(NOT_CUT, ".dim-name") == []


def test_every_column_of_the_environment_tables_has_a_header(page: Any) -> None:
    page.goto("/#/environment")
    page.wait_for_selector("table.libraries", timeout=240_000)
    for table in ("table.libraries", "table.targets"):
        headers = page.locator(f"{table} th").all_text_contents()
        assert headers and all(text.strip() for text in headers), (table, headers)
