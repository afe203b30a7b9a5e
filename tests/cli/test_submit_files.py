"""`torchport submit DIR` sends only regular files inside the directory (issue 33, item 10),
against a real API process: a link among the files it would send (a `model.safetensors`
linked to a private key) or a device or pipe is refused with a usage error and nothing
is sent, unless `--follow-links` names the links; an adapter whose
`base_model_name_or_path` is a directory elsewhere on disk is refused unless the base is
named (`torchport submit BASE --adapter ADAPTER`); and every file sent is listed, with
its size, on stderr before it is sent."""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

import httpx

from tests.cli.test_jobs import Server, pg_url, redis_prefix, server, torchport

__all__ = ["pg_url", "redis_prefix", "server"]

SECRET = b"-----BEGIN OPENSSH PRIVATE KEY----- not for the server"


def _checkpoint(directory: Path) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (directory / "model.safetensors").write_bytes(b"weights" * 100)
    return directory


def _adapter(directory: Path, base: str) -> Path:
    directory.mkdir(parents=True)
    config = {"peft_type": "LORA", "base_model_name_or_path": base}
    (directory / "adapter_config.json").write_text(json.dumps(config))
    (directory / "adapter_model.safetensors").write_bytes(b"lora" * 10)
    return directory


def _jobs(server: Server) -> int:
    answer = httpx.get(
        f"{server.url}/v1/exports",
        params={"limit": 100},
        headers={"Authorization": f"Bearer {server.alice}"},
    )
    return len(answer.json()["items"])


def _sent(server: Server, job_id: str) -> dict[str, bytes]:
    """The members of the model zip the server received."""
    answer = httpx.get(
        f"{server.url}/v1/exports/{job_id}/uploads/model",
        headers={"Authorization": f"Bearer {server.alice}"},
    )
    assert answer.status_code == 200, answer.text
    with zipfile.ZipFile(io.BytesIO(answer.content)) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def _refused(server: Server, *args: str) -> dict[str, object]:
    before = _jobs(server)
    done = torchport(server, "submit", *args, "--json")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert _jobs(server) == before  # nothing was sent
    body = json.loads(done.stdout)
    assert body["code"] == "invalid_request"
    details = body["details"]
    assert isinstance(details, dict)
    return details


def test_a_link_among_the_files_sent_is_refused_unless_named(
    server: Server, tmp_path: Path
) -> None:
    key = tmp_path / "home" / ".ssh" / "id_ed25519"
    key.parent.mkdir(parents=True)
    key.write_bytes(SECRET)
    directory = _checkpoint(tmp_path / "ckpt")
    (directory / "model.safetensors").unlink()
    (directory / "model.safetensors").symlink_to(key)
    details = _refused(server, str(directory))
    assert (details["reason"], details["path"]) == ("symlink", str(directory / "model.safetensors"))

    inside = tmp_path / "inside"  # a link to a file inside the directory is a link too
    _checkpoint(inside)
    (inside / "config.json").rename(inside / "real-config.json")
    (inside / "config.json").symlink_to("real-config.json")
    assert _refused(server, str(inside))["reason"] == "symlink"

    # named: --follow-links sends what the links point to, and says so first
    done = torchport(server, "submit", str(directory), "--follow-links", "--json")
    assert done.returncode == 0, done.stderr
    job_id = json.loads(done.stdout)["id"]
    assert _sent(server, job_id)["model.safetensors"] == SECRET
    assert "model.safetensors" in done.stderr and str(len(SECRET)) in done.stderr


def test_a_device_or_a_pipe_is_refused_even_with_follow_links(
    server: Server, tmp_path: Path
) -> None:
    piped = _checkpoint(tmp_path / "piped")
    (piped / "model.safetensors").unlink()
    os.mkfifo(piped / "model.safetensors")
    details = _refused(server, str(piped), "--follow-links")
    assert details["reason"] == "special_file"

    device = _checkpoint(tmp_path / "device")
    (device / "model.safetensors").unlink()
    (device / "model.safetensors").symlink_to("/dev/zero")
    assert _refused(server, str(device), "--follow-links")["reason"] == "special_file"
    assert _refused(server, str(device))["reason"] == "symlink"


def test_a_linked_adapter_folder_is_refused(server: Server, tmp_path: Path) -> None:
    directory = _checkpoint(tmp_path / "ckpt")
    elsewhere = _adapter(tmp_path / "elsewhere", "ckpt")
    (directory / "lora").symlink_to(elsewhere, target_is_directory=True)
    details = _refused(server, str(directory))
    assert (details["reason"], details["path"]) == ("symlink", str(directory / "lora"))


def test_an_adapters_base_elsewhere_is_sent_only_when_named(server: Server, tmp_path: Path) -> None:
    base = _checkpoint(tmp_path / "somewhere" / "base")
    adapter = _adapter(tmp_path / "adapter", str(base))
    details = _refused(server, str(adapter))
    assert (details["reason"], details["base"]) == ("outside_directory", str(base))
    relative = _adapter(tmp_path / "relative", "../somewhere/base")
    assert _refused(server, str(relative))["reason"] == "outside_directory"

    done = torchport(server, "submit", str(base), "--adapter", str(adapter), "--json")
    assert done.returncode == 0, done.stderr
    sent = _sent(server, json.loads(done.stdout)["id"])
    assert sorted(sent) == [
        "adapter/adapter_config.json",
        "adapter/adapter_model.safetensors",
        "config.json",
        "model.safetensors",
    ]


def test_only_regular_files_are_sent_and_each_is_listed_first(
    server: Server, tmp_path: Path
) -> None:
    directory = _checkpoint(tmp_path / "ckpt")
    elsewhere = tmp_path / "README.md"
    elsewhere.write_text("# a model card")
    (directory / "README.md").symlink_to(elsewhere)  # a link not sent is no matter
    done = torchport(server, "submit", str(directory), "--json")
    assert done.returncode == 0, done.stderr
    sent = _sent(server, json.loads(done.stdout)["id"])
    assert sorted(sent) == ["config.json", "model.safetensors"]
    for name, data in sent.items():
        [line] = [line for line in done.stderr.splitlines() if name in line]
        assert str(len(data)) in line


def test_an_s3_model_is_sent_as_a_reference_and_refused_by_a_server_without_sources(
    server: Server,
) -> None:
    done = torchport(server, "submit", "s3://models/team/bert", "--json")
    assert done.returncode == 2, done.stderr
    body = json.loads(done.stdout)
    assert (body["code"], body["details"]["reason"], body["details"]["url"]) == (
        "invalid_request",
        "source_not_allowed",
        "s3://models/team/bert/",
    )
    local = torchport(server, "export", "s3://models/team/bert", "--json")
    assert local.returncode == 2
    assert json.loads(local.stdout)["details"]["reason"] == "reference_needs_server"
