"""The upload form with a Hugging Face checkpoint: a checkpoint zip, or a chosen
`save_pretrained` folder zipped by the page (stored, in plain JS), with the `task` select;
the job starts on the real server and its options carry the task."""

from __future__ import annotations

import time
import zipfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.conftest import Server
from tests.browser.test_pages import job_id_of

pytestmark = pytest.mark.slow

transformers = pytest.importorskip("transformers")

TINY_BERT = {
    "vocab_size": 64,
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 32,
    "max_position_embeddings": 64,
}


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BertForMaskedLM, saved as `save_pretrained` writes it, plus a tokenizer file
    the folder upload sends and a model card it leaves behind."""
    import torch

    directory = tmp_path_factory.mktemp("checkpoint") / "tiny-bert"
    torch.manual_seed(0)
    config = transformers.BertConfig(**TINY_BERT)
    transformers.BertForMaskedLM(config).save_pretrained(directory)
    (directory / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    (directory / "README.md").write_text("# tiny-bert\n")
    return directory


def finished(server: Server, job_id: str, timeout_s: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job: dict[str, Any] = server.api(f"v1/exports/{job_id}")
        if job["status"] in ("succeeded", "failed", "canceled"):
            return job
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} did not finish in {timeout_s} s")


def test_a_checkpoint_zip_with_a_task_starts_a_job(page: Any, server: Server, bert: Path) -> None:
    archive = bert.parent / "tiny-bert.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in sorted(bert.iterdir()):
            zf.write(path, f"tiny-bert/{path.name}")
    page.goto("/")
    page.set_input_files("[data-testid=file-model]", str(archive))
    page.wait_for_selector("#task-row:not([hidden])")
    assert page.is_hidden("input[name=entry]")
    tasks = page.locator("#task option").evaluate_all("options => options.map(o => o.value)")
    assert tasks[0] == "" and "fill-mask" in tasks and "text-generation" in tasks
    page.select_option("#task", "fill-mask")
    page.click("#submit")
    job_id = job_id_of(page)
    page.wait_for_selector("[data-stage=loading]:not([data-state=pending])", timeout=120_000)
    job = server.api(f"v1/exports/{job_id}")
    assert job["options"]["task"] == "fill-mask"
    assert job["options"]["entry"] is None
    assert job["model_name"] == "tiny-bert.zip"


def test_a_chosen_folder_is_zipped_and_exports(page: Any, server: Server, bert: Path) -> None:
    page.goto("/")
    page.set_input_files("[data-testid=folder-model]", str(bert))
    page.wait_for_selector("#task-row:not([hidden])")
    sent = page.text_content("#folder-status") or ""
    assert "model.safetensors" in sent and "vocab.txt" in sent and "README.md" not in sent
    page.select_option("#task", "feature-extraction")
    page.click("#submit")
    job = finished(server, job_id_of(page))
    assert job["status"] == "succeeded", job["error"]
    assert job["model_name"] == "tiny-bert.zip"
    assert job["options"]["task"] == "feature-extraction"
    report = server.api(f"v1/exports/{job['id']}/artifacts/report.json")
    assert report["checkpoint"]["task"] == "feature-extraction"
    assert report["checkpoint"]["weights_files"] == ["model.safetensors"]
    assert report["checkpoint"]["tokenizer_files"] == ["vocab.txt"]
    vocab = httpx.get(f"{server.url}v1/exports/{job['id']}/artifacts/vocab.txt", timeout=10)
    assert vocab.status_code == 200  # beside the program, as uploaded
    assert vocab.content == (bert / "vocab.txt").read_bytes()


def test_a_llama_folder_for_text_generation_shows_its_generation(
    page: Any, server: Server, tmp_path: Path
) -> None:
    """A generation-ready export: the result page says the program's greedy generation
    matched eager transformers, and shows the tokens."""
    from tests.engine.test_generation import llama

    directory = llama(tmp_path)
    page.goto("/")
    page.set_input_files("[data-testid=folder-model]", str(directory))
    page.wait_for_selector("#task-row:not([hidden])")
    page.select_option("#task", "text-generation")
    page.click("#submit")
    job = finished(server, job_id_of(page))
    assert job["status"] == "succeeded", job["error"]
    report = server.api(f"v1/exports/{job['id']}/artifacts/report.json")
    expected = report["generation"]["check"]["expected"]
    line = page.wait_for_selector(".generation-check", timeout=60_000)
    assert line.get_attribute("data-matched") == "true"
    assert " ".join(str(token) for token in expected) in (line.text_content() or "")


def test_a_t5_folder_exports_and_shows_its_encoder(
    page: Any, server: Server, tmp_path: Path
) -> None:
    """An encoder-decoder checkpoint through the form, the API and a sandboxed worker:
    two programs, the encoder's verdict on the result page, its file downloadable."""
    from tests.engine.test_seq2seq import t5

    directory = t5(tmp_path)
    page.goto("/")
    page.set_input_files("[data-testid=folder-model]", str(directory))
    page.wait_for_selector("#task-row:not([hidden])")
    page.click("#submit")  # the task inferred from T5ForConditionalGeneration
    job = finished(server, job_id_of(page))
    assert job["status"] == "succeeded", job["error"]
    assert {"program.pt2", "encoder.pt2"} <= {a["name"] for a in job["artifacts"]}
    report = server.api(f"v1/exports/{job['id']}/artifacts/report.json")
    assert report["checkpoint"]["task"] == "text2text-generation"
    encoder = report["generation"]["encoder"]
    assert encoder["roundtrip"]["status"] == "passed"
    shown = page.wait_for_selector("[data-encoder='encoder.pt2']", timeout=60_000)
    verdict = shown.query_selector("[data-verdict]")
    assert verdict is not None and verdict.get_attribute("data-verdict") == "verified"
    assert "encoder_sequence_length" in (shown.text_content() or "")
    assert page.wait_for_selector(".generation-check").get_attribute("data-matched") == "true"


def test_a_folder_with_an_adapter_sub_folder_sends_the_adapter(
    page: Any, server: Server, tmp_path: Path
) -> None:
    """As `torchport submit DIR`: the sub-folder holding `adapter_config.json` goes along
    with its two files (not its README), and the engine merges it."""
    import torch

    peft = pytest.importorskip("peft")
    config = transformers.BertConfig(**TINY_BERT)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)
    directory = tmp_path / "tiny-bert-lora"
    model.bert.save_pretrained(directory)  # the base: BertModel
    lora = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["query", "value"], task_type="SEQ_CLS"
    )
    peft.get_peft_model(model, lora).save_pretrained(directory / "lora")
    assert (directory / "lora" / "README.md").is_file()  # peft writes one; it stays behind

    page.goto("/")
    page.set_input_files("[data-testid=folder-model]", str(directory))
    page.wait_for_selector("#task-row:not([hidden])")
    sent = (page.text_content("#folder-status") or "").split(": ", 1)[1].split(", ")
    assert sent == [
        "config.json",
        "model.safetensors",
        "lora/adapter_config.json",
        "lora/adapter_model.safetensors",
    ]
    page.click("#submit")  # the task from the adapter's task_type
    job = finished(server, job_id_of(page))
    assert job["status"] == "succeeded", job["error"]
    report = server.api(f"v1/exports/{job['id']}/artifacts/report.json")
    checkpoint = report["checkpoint"]
    assert (checkpoint["task"], checkpoint["task_source"]) == ("text-classification", "adapter")
    assert checkpoint["adapter"]["path"] == "lora"
    assert checkpoint["adapter"]["merged"] is True
