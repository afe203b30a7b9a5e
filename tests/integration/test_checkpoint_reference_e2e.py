"""A checkpoint named by reference, end to end through real processes: the API lists an
allow-listed `s3://` prefix, the worker reads it with the deployment's credentials (moto's
S3 server on loopback) into the sandbox, and the export succeeds; an object changed after
the job was submitted fails the job (`invalid_request`, `source_changed`) instead of
exporting other bytes."""

from __future__ import annotations

import tempfile
from pathlib import Path

import boto3
import pytest

from schemas.source import CheckpointSource
from tests.conftest import REDIS_URL
from tests.engine.test_checkpoints import bert
from tests.integration.conftest import Stack, stack_env
from tests.s3_server import s3_endpoint

pytestmark = pytest.mark.slow
pytest.importorskip("transformers")


def test_a_referenced_checkpoint_exports_and_a_changed_one_fails(
    tmp_path: Path, pg_url: str, redis_prefix: str
) -> None:
    with s3_endpoint("models") as endpoint:
        s3 = boto3.client("s3", endpoint_url=endpoint)
        checkpoint = bert(Path(tempfile.mkdtemp(dir=tmp_path)))
        for folder in ("team/bert/", "team/moving/"):
            for path in checkpoint.iterdir():
                s3.upload_file(str(path), "models", folder + path.name)
        env = stack_env(tmp_path, pg_url, REDIS_URL, redis_prefix + "refs:")
        env |= {
            "TORCHPORT_CHECKPOINT_SOURCES": "s3://models/team/",
            "TORCHPORT_S3_ENDPOINT_URL": endpoint,
        }
        stack = Stack(tmp_path, env)
        try:
            stack.start_api()
            options = '{"decomposition": {"mode": "none"}, "verify": {"samples": 0}}'
            jobs = {}
            for name in ("bert", "moving"):
                answer = stack.http.post(
                    "/v1/exports",
                    files={
                        "model_url": (None, f"s3://models/team/{name}/"),
                        "options": (None, options),
                    },
                )
                assert answer.status_code == 202, answer.text
                jobs[name] = answer.json()["id"]
            # After the listing, before any worker reads it: the weights change.
            s3.put_object(Bucket="models", Key="team/moving/model.safetensors", Body=b"x")
            stack.start_worker()
            done = stack.wait_done(jobs["bert"], timeout=300)
            assert done["status"] == "succeeded", done["error"]
            assert "program.pt2" in {a["name"] for a in done["artifacts"]}
            report = stack.http.get(f"/v1/exports/{jobs['bert']}/artifacts/report.json").json()
            assert report["checkpoint"]["task"] == "fill-mask"
            manifest = CheckpointSource.model_validate_json(
                stack.http.get(f"/v1/exports/{jobs['bert']}/uploads/model").content
            )
            assert {f.path for f in manifest.files} == {"config.json", "model.safetensors"}
            failed = stack.wait_done(jobs["moving"], timeout=120)
            assert failed["status"] == "failed"
            error = failed["error"]
            assert (error["code"], error["stage"], error["details"]["reason"]) == (
                "invalid_request",
                "loading",
                "source_changed",
            )
            assert error["details"]["key"] == "team/moving/model.safetensors"
        finally:
            stack.stop()
