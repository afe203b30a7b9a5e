"""An S3 HTTP endpoint on loopback for tests: moto's server, with test credentials in
the environment (boto3's default chain reads them, as a deployment's workers would)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def s3_endpoint(*buckets: str) -> Iterator[str]:
    """The URL of a fresh moto server holding these (empty) buckets."""
    import boto3
    from moto.server import ThreadedMotoServer

    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        env.setenv("AWS_DEFAULT_REGION", "us-east-1")
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=(port := _free_port()))
        server.start()
        url = f"http://127.0.0.1:{port}"
        try:
            s3 = boto3.client("s3", endpoint_url=url)
            for bucket in buckets:
                s3.create_bucket(Bucket=bucket)
            yield url
        finally:
            server.stop()
