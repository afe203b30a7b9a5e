"""The S3-compatible store against a real S3 HTTP endpoint (moto's server on loopback)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from persistence.store import BlobNotFound, StoreError, open_store
from tests.s3_server import s3_endpoint


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with s3_endpoint("art") as url:
        yield url


def test_put_read_range_fetch_and_idempotence(endpoint: str, tmp_path: Path) -> None:
    store = open_store("s3://art/jobs", s3_endpoint_url=endpoint)
    store.check()
    data = bytes(range(256)) * 4096  # 1 MiB: more than one read chunk
    source = tmp_path / "blob"
    source.write_bytes(data)
    sha, size = store.put_file(source)
    assert (sha, size) == (hashlib.sha256(data).hexdigest(), len(data))
    assert store.put_file(source) == (sha, size)
    assert store.exists(sha) and store.size(sha) == len(data)
    assert b"".join(store.read(sha)) == data
    assert b"".join(store.read(sha, 10, 19)) == data[10:20]
    store.fetch(sha, tmp_path / "copy" / "blob")
    assert (tmp_path / "copy" / "blob").read_bytes() == data
    keys = [
        o["Key"]
        for o in boto3.client("s3", endpoint_url=endpoint).list_objects_v2(Bucket="art")["Contents"]
    ]
    assert keys == [f"jobs/{sha[:2]}/{sha}"]


def test_missing_blob_and_missing_bucket(endpoint: str) -> None:
    store = open_store("s3://art", s3_endpoint_url=endpoint)
    absent = "0" * 64
    assert store.exists(absent) is False
    with pytest.raises(BlobNotFound):
        store.size(absent)
    with pytest.raises(StoreError):
        open_store("s3://no-such-bucket", s3_endpoint_url=endpoint).check()


def test_a_zip_member_is_read_from_an_s3_blob(endpoint: str, tmp_path: Path) -> None:
    import zipfile

    from service.archives import MAX_ZIP_DIRECTORY_BYTES, index_stored, read_at

    store = open_store("s3://art/zips", s3_endpoint_url=endpoint)
    archive = tmp_path / "pkg.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("pkg/net.py", b"x = 1\n" * 100)
    sha, size = store.put_file(archive)
    where = {"job_id": "j", "member": "pkg/net.py"}
    # Range reads of the directory and of the member: the blob is never downloaded.
    index = index_stored(store, sha, max_directory_bytes=MAX_ZIP_DIRECTORY_BYTES, **where)
    assert list(index) == ["pkg/net.py"]
    assert read_at(store, sha, index["pkg/net.py"], "pkg/net.py", **where) == b"x = 1\n" * 100
    # Past the end a range read is empty, as a local file's (S3 answers 416).
    assert list(store.read(sha, size, size + 10)) == []


def test_the_collector_deletes_expired_blobs_from_s3_and_keeps_shared_ones(
    endpoint: str, tmp_path: Path
) -> None:
    from datetime import timedelta

    from persistence import retention
    from persistence.database import make_engine, make_session_factory, migrate, transaction
    from persistence.models import utcnow
    from tests.service.conftest import job_row

    url = f"sqlite:///{tmp_path / 'torchport.db'}"  # the embedded database, on an S3 store
    migrate(url)
    engine = make_engine(url)
    sessions = make_session_factory(engine)
    store = open_store("s3://art/gc", s3_endpoint_url=endpoint)
    digests = {}
    for name in ("model", "shared", "only-old"):
        path = tmp_path / name
        path.write_bytes(name.encode() * 1000)
        sha, size = hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_size
        retention.lease(sessions, {sha: size})
        assert store.put_file(path, sha) == (sha, size)
        digests[name] = sha
    long_ago = utcnow() - timedelta(days=30)
    with transaction(sessions) as session:
        for job_id, weights, finished in (
            ("old", digests["only-old"], long_ago),
            ("recent", digests["shared"], utcnow()),
            ("old-shared", digests["shared"], long_ago),
        ):
            session.add(job_row(job_id, digests["model"], weights, finished))

    done = retention.collect(
        sessions, store, retention=timedelta(days=7), now=utcnow() + retention.LEASE
    )

    assert done.expired_jobs == ["old", "old-shared"]
    assert set(done.deleted) == {digests["only-old"]}
    assert done.deleted_bytes == len(b"only-old") * 1000
    keys = {
        o["Key"]
        for o in boto3.client("s3", endpoint_url=endpoint).list_objects_v2(
            Bucket="art", Prefix="gc/"
        )["Contents"]
    }
    assert keys == {f"gc/{digests[n][:2]}/{digests[n]}" for n in ("model", "shared")}
    store.delete(digests["only-old"])  # deleting what is gone is no error
    engine.dispose()


def test_the_artifacts_zip_streams_from_s3(endpoint: str, tmp_path: Path) -> None:
    import io
    import json
    import zipfile

    from persistence.models import Artifact
    from service.artifact_zip import MANIFEST, artifact_zip

    store = open_store("s3://art/zips", s3_endpoint_url=endpoint)
    contents = {"program.pt2": b"PK" + bytes(range(256)) * 8192, "report.json": b'{"a": 1}'}
    artifacts = []
    for name, data in contents.items():
        (tmp_path / name).write_bytes(data)
        sha, size = store.put_file(tmp_path / name)
        artifacts.append(Artifact(name=name, sha256=sha, size=size, media_type="x"))
    archive = b"".join(artifact_zip(store, "job", artifacts))
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        assert {name: zf.read(name) for name in contents} == contents
        listed = json.loads(zf.read(MANIFEST))["artifacts"]
    assert [(a["name"], a["sha256"]) for a in listed] == [(a.name, a.sha256) for a in artifacts]
