"""A checkpoint named by reference (`model_url`): the API checks the allow-list and lists
the prefix without reading an object's bytes; the worker reads exactly what was listed,
only while it is unchanged, under a prefix its own allow-list admits. Against moto's S3
server on loopback."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from fastapi.testclient import TestClient

from persistence import sources
from persistence.database import transaction
from persistence.store import LocalStore
from schemas import UploadRef
from schemas.source import SOURCE_MANIFEST, CheckpointSource, allowed_prefix, parse_prefix
from service import auth, references
from service.app import build_state, create_app
from service.deps import AppState
from service.settings import ServiceSettings
from tests.s3_server import s3_endpoint
from tests.service.conftest import LOOPBACK_CLIENT
from worker.references import ReferencedCheckpoint

CHECKPOINT = {
    "config.json": b'{"model_type": "bert"}',
    "model.safetensors": b"w" * 3000,
    "generation_config.json": b"{}",
    "tokenizer.json": b"{}",
    "original/consolidated.00.pth": b"p" * 5000,
    "lora/adapter_config.json": b"{}",
    "lora/adapter_model.safetensors": b"a" * 100,
    "lora/notes.txt": b"n",
}
READ = [
    "config.json",
    "generation_config.json",
    "lora/adapter_config.json",
    "lora/adapter_model.safetensors",
    "model.safetensors",
    "tokenizer.json",
]


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with s3_endpoint("models", "other") as url:
        s3 = boto3.client("s3", endpoint_url=url)
        for folder in ("shared/llama/", "shared-evil/llama/", "tenants/KEYID/llama/"):
            for name, data in CHECKPOINT.items():
                s3.put_object(Bucket="models", Key=folder + name, Body=data)
        s3.put_object(Bucket="models", Key="shared/empty/README.md", Body=b"x")
        s3.put_object(Bucket="other", Key="llama/config.json", Body=b"{}")
        yield url


class Recording:
    """An S3 client that notes every call the API makes."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.calls = inner, []

    def __getattr__(self, name: str) -> Any:
        self.calls.append(name)
        return getattr(self.inner, name)


@pytest.fixture
def api(endpoint: str, tmp_path: Path) -> Iterator[tuple[TestClient, AppState, Recording]]:
    recording = Recording(sources.client(endpoint))
    settings = ServiceSettings(
        data_dir=tmp_path / "data",
        database_url=f"sqlite:///{tmp_path / 'data' / 'torchport.db'}",
        broker_url="filesystem://",
        reaper_interval_s=3600.0,
        s3_endpoint_url=endpoint,
        checkpoint_sources="s3://models/shared/, s3://models/tenants/{key}/",
        max_checkpoint_bytes=20_000,
    )
    state = build_state(settings)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(references.sources, "client", lambda _endpoint: recording)
        with TestClient(create_app(state=state), client=LOOPBACK_CLIENT) as client:
            yield client, state, recording
    state.engine.dispose()


def _submit(client: TestClient, url: str, **extra: Any) -> Any:
    files = {"model_url": (None, url), **extra.pop("files", {})}
    return client.post("/v1/exports", files=files, **extra)


def test_the_api_lists_the_prefix_and_never_reads_its_bytes(api: Any) -> None:
    client, _, recording = api
    answer = _submit(client, "s3://models/shared/llama")
    assert answer.status_code == 202, answer.text
    assert set(recording.calls) == {"list_objects_v2"}
    manifest = CheckpointSource.model_validate_json(
        client.get(f"/v1/exports/{answer.json()['id']}/uploads/model").content
    )
    assert manifest.url == "s3://models/shared/llama/"
    assert [f.path for f in manifest.files] == READ
    assert {f.path: f.size for f in manifest.files}["model.safetensors"] == 3000
    assert all(f.etag.strip('"') for f in manifest.files)
    again = _submit(client, "s3://models/shared/llama/")
    assert again.json()["id"] == answer.json()["id"]  # the same listing: the same job


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("s3://models/shared-evil/llama/", "source_not_allowed"),
        ("s3://other/llama/", "source_not_allowed"),
        ("s3://models/tenants/KEYID/llama/", "source_not_allowed"),  # no key: no tenant
        ("s3://models/shared/../tenants/KEYID/llama/", "bad_url"),
        ("s3://models/shared//llama/", "bad_url"),
        ("https://models.s3.amazonaws.com/shared/llama/", "bad_url"),
        ("s3://169.254.169.254/latest/", "bad_url"),
        ("s3://models/shared/empty/", "source_not_a_checkpoint"),
    ],
)
def test_references_outside_the_allow_list_or_no_checkpoint_are_refused(
    api: Any, url: str, reason: str
) -> None:
    client, _, recording = api
    answer = _submit(client, url)
    assert answer.status_code == 400, answer.text
    assert (answer.json()["code"], answer.json()["details"]["reason"]) == (
        "invalid_request",
        reason,
    )
    if reason != "source_not_a_checkpoint":
        assert recording.calls == []  # refused before S3 is asked anything


def test_a_model_file_and_a_model_url_together_are_refused(api: Any) -> None:
    client, _, _ = api
    answer = _submit(
        client, "s3://models/shared/llama/", files={"model": ("m.py", b"model = None\n")}
    )
    assert answer.status_code == 400
    assert answer.json()["details"]["reason"] == "model_and_model_url"


def test_a_checkpoint_over_the_limit_is_upload_too_large(api: Any, endpoint: str) -> None:
    client, _, _ = api
    s3 = boto3.client("s3", endpoint_url=endpoint)
    s3.put_object(Bucket="models", Key="shared/big/config.json", Body=b"{}")
    s3.put_object(Bucket="models", Key="shared/big/model.safetensors", Body=b"x" * 20_001)
    answer = _submit(client, "s3://models/shared/big/")
    assert answer.status_code == 413
    body = answer.json()
    assert (body["code"], body["details"]["limit"], body["details"]["bytes"]) == (
        "upload_too_large",
        "checkpoint",
        20_003,
    )


def test_a_tenant_prefix_is_its_own_keys_only(api: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth, "CACHE_TTL_S", 0.0)  # the keys made here count at once
    client, state, _ = api
    with transaction(state.sessions) as session:
        alice = auth.create_key(session, "alice")
    with transaction(state.sessions) as session:
        bob = auth.create_key(session, "bob")
    own = f"s3://models/tenants/{alice.id}/llama/"
    headers = {"Authorization": f"Bearer {bob.secret}"}
    refused = _submit(client, own, headers=headers)
    assert refused.json()["details"]["reason"] == "source_not_allowed"
    headers = {"Authorization": f"Bearer {alice.secret}"}
    # alice's prefix is allowed; it holds nothing here, which is the next check's to say
    assert _submit(client, own, headers=headers).json()["details"]["reason"] == (
        "source_not_a_checkpoint"
    )


def test_the_allow_list_matches_whole_prefixes() -> None:
    def allowed(url: str, key: str | None = None) -> bool:
        entries = ["s3://models/shared/", "s3://models/tenants/{key}/"]
        return allowed_prefix(parse_prefix(url), entries, key) is not None

    assert allowed("s3://models/shared/a/b")
    assert not allowed("s3://models/sharedx/a")
    assert not allowed("s3://models/")
    assert allowed("s3://models/tenants/k1/x/", "k1")
    assert not allowed("s3://models/tenants/k1/x/", "k2")
    assert not allowed("s3://models/tenants/k1/x/")
    assert not allowed("s3://models/tenants/x/", "../x")


def _manifest(store: LocalStore, tmp_path: Path, url: str, endpoint: str) -> UploadRef:
    source = sources.list_source(sources.client(endpoint), url, max_files=100, max_bytes=10**6)
    path = tmp_path / SOURCE_MANIFEST
    path.write_text(source.model_dump_json())
    sha256, size = store.put_file(path)
    return UploadRef(name=SOURCE_MANIFEST, sha256=sha256, size=size)


def test_the_worker_reads_exactly_what_was_listed(endpoint: str, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    ref = _manifest(store, tmp_path, "s3://models/shared/llama/", endpoint)
    archive = tmp_path / "staged.zip"
    allowed = ("s3://models/shared/",)
    ReferencedCheckpoint(store, ref, allowed, None, endpoint).copy_to(archive)
    with zipfile.ZipFile(archive) as zf:
        assert sorted(zf.namelist()) == READ
        assert {n: zf.read(n) for n in READ} == {n: CHECKPOINT[n] for n in READ}
        assert all(i.compress_type == zipfile.ZIP_STORED for i in zf.infolist())


def test_a_changed_object_fails_the_job_instead_of_exporting_other_bytes(
    endpoint: str, tmp_path: Path
) -> None:
    s3 = boto3.client("s3", endpoint_url=endpoint)
    for name, data in CHECKPOINT.items():
        s3.put_object(Bucket="models", Key=f"shared/moving/{name}", Body=data)
    store = LocalStore(tmp_path / "store")
    ref = _manifest(store, tmp_path, "s3://models/shared/moving/", endpoint)
    s3.put_object(Bucket="models", Key="shared/moving/model.safetensors", Body=b"v" * 3000)
    checkpoint = ReferencedCheckpoint(store, ref, ("s3://models/shared/",), None, endpoint)
    with pytest.raises(sources.SourceError) as caught:
        checkpoint.copy_to(tmp_path / "staged.zip")
    assert caught.value.reason == "source_changed"
    assert caught.value.details["key"] == "shared/moving/model.safetensors"
    s3.delete_object(Bucket="models", Key="shared/moving/config.json")
    with pytest.raises(sources.SourceError) as caught:
        checkpoint.copy_to(tmp_path / "staged2.zip")
    assert caught.value.reason == "source_changed"


def test_the_worker_holds_a_manifest_to_its_own_allow_list(endpoint: str, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    ref = _manifest(store, tmp_path, "s3://models/shared/llama/", endpoint)
    elsewhere = ReferencedCheckpoint(store, ref, ("s3://models/tenants/",), None, endpoint)
    with pytest.raises(sources.SourceError) as caught:
        elsewhere.copy_to(tmp_path / "staged.zip")
    assert caught.value.reason == "source_not_allowed"
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps({"url": "s3://models/shared/../x/", "files": []}))
    sha256, size = store.put_file(forged)
    bad = UploadRef(name=SOURCE_MANIFEST, sha256=sha256, size=size)
    with pytest.raises(sources.SourceError) as caught:
        ReferencedCheckpoint(store, bad, ("s3://models/",), None, endpoint).copy_to(
            tmp_path / "staged.zip"
        )
    assert caught.value.reason == "bad_manifest"
    assert (
        not (tmp_path / "staged.zip").exists()
        or zipfile.ZipFile(io.BytesIO((tmp_path / "staged.zip").read_bytes())).namelist() == []
    )
