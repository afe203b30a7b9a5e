"""docs/huggingface.md, run as a reader runs it: its install is the README's, this
environment has what that install installs, and its commands (taken from the doc's own
code blocks, so the doc and this test cannot drift) run end to end, printing what the doc
says they print."""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from contextlib import closing, suppress
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "huggingface.md"
SERVER = "http://127.0.0.1:8000"
"""The server the doc's commands name; the test's own runs on a free port instead."""
ILLUSTRATIVE = ("~/runs/my-lora",)
"""Blocks that name the reader's own files (an adapter they trained), not runnable here."""

SERVE = (sys.executable, "-m", "torchport.cli", "serve")


@dataclass(frozen=True)
class Block:
    section: str
    language: str
    text: str


def blocks(path: Path = DOC) -> list[Block]:
    """The fenced code blocks of a Markdown file, each with the `## ` section it is in."""
    found: list[Block] = []
    section = ""
    lines = iter(path.read_text().splitlines())
    for line in lines:
        if line.startswith("## "):
            section = line[3:]
        fence = re.match(r"^```(\w*)$", line)
        if fence is None:
            continue
        body: list[str] = []
        for inner in lines:
            if inner == "```":
                break
            body.append(inner)
        found.append(Block(section, fence.group(1), "\n".join(body) + "\n"))
    return found


def _extras(name: str, pyproject: dict[str, object]) -> list[Requirement]:
    """The requirements of an extra of our pyproject, its own extras (`torchport[a,b]`)
    resolved."""
    table = pyproject["project"]["optional-dependencies"]  # type: ignore[index]
    found: list[Requirement] = []
    for text in table[name]:
        requirement = Requirement(text)
        if requirement.name == "torchport":
            for extra in sorted(requirement.extras):
                found += _extras(extra, pyproject)
        else:
            found.append(requirement)
    return found


def installed_by(command: str) -> list[Requirement]:
    """Every requirement the `pip install` commands of a shell line install: named ones,
    and for `-e '.[x]'` the extras of our pyproject."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wanted: list[Requirement] = []
    for part in command.split("&&"):
        words = shlex.split(part)
        if words[:2] != ["pip", "install"]:
            continue
        for word in words[2:]:
            if word.startswith("-") and word != "-e":
                continue
            if word == "-e":
                continue
            if word.startswith("."):
                extras = re.fullmatch(r"\.(?:\[(.*)\])?", word)
                assert extras is not None, word
                for extra in filter(None, (extras.group(1) or "").split(",")):
                    wanted += _extras(extra, pyproject)
                continue
            wanted.append(Requirement(word))
    return wanted


def _unmet(requirements: list[Requirement]) -> list[str]:
    unmet = []
    for requirement in requirements:
        try:
            version = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            unmet.append(f"{requirement} (not installed)")
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            unmet.append(f"{requirement} ({version} installed)")
    return unmet


def test_the_walkthrough_starts_with_the_readme_install_and_this_environment_has_it() -> None:
    first = blocks()[0]
    assert first.section == "" and first.language == "bash"  # before the first step
    [install] = first.text.strip().splitlines()
    readme = (ROOT / "README.md").read_text().split("## Set up", 1)[1]
    service = readme.split("```bash\n", 1)[1].split("\n```", 1)[0]
    # the README's first set-up command is the same install, then starts the server
    assert service == f"{install} && torchport serve"
    wanted = installed_by(install)
    names = {requirement.name for requirement in wanted}
    # what the walkthrough imports and runs: the model libraries, every target's packages
    assert {"torch", "transformers", "peft", "onnx", "onnxruntime", "executorch"} <= names
    assert {"torchao", "onnxscript", "ruamel.yaml", "tabulate"} <= names
    assert _unmet(wanted) == []


def _free_port() -> int:
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """`torchport serve` with a data directory of its own, on a free port."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHPORT_")}
    env["TORCHPORT_SANDBOX_WARM_LIBRARIES"] = "[]"
    data = tmp_path / "server"
    data.mkdir()
    log = tmp_path / "serve.log"
    process = subprocess.Popen(
        [*SERVE, "--port", str(port), "--data-dir", str(data)],
        cwd=data,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            assert process.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, "torchport serve did not answer"
            with suppress(httpx.HTTPError):
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            time.sleep(0.3)
        yield url
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def _cancel_unfinished(url: str) -> None:
    """curl only submits (the doc waits for nothing): its job is canceled, so that the
    steps after it do not share two cores with an export no one reads."""
    for job in httpx.get(f"{url}/v1/exports", timeout=10).json()["items"]:
        if job["status"] in ("queued", "running"):
            httpx.delete(f"{url}/v1/exports/{job['id']}", timeout=10)


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.slow
@pytest.mark.timeout(1500)  # three targets converted, then two exports: ~6 min on 2 cores
def test_the_walkthrough_runs_end_to_end(tmp_path: Path, served: str) -> None:
    """Every runnable block after the install, in order, in one directory: bash blocks in
    bash (the server's address swapped for the test's), Python blocks in this interpreter,
    and each bare block (what a command prints) found in the output of the command before
    it. The install itself is the environment this runs in (the test above)."""
    work = tmp_path / "reader"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHPORT_")}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        TORCHPORT_SERVER=served,
        TORCHPORT_SANDBOX_WARM_LIBRARIES="[]",
        COLUMNS="200",  # the summary's lines unwrapped, as the doc shows them
    )
    steps = blocks()[1:]
    for marker in ILLUSTRATIVE:
        assert any(marker in block.text for block in steps), f"no block names {marker}"
    output = ""
    ran: list[str] = []
    for block in steps:
        if any(marker in block.text for marker in ILLUSTRATIVE):
            continue
        if block.language == "":
            missing = [line for line in block.text.splitlines() if _flat(line) not in output]
            assert missing == [], f"{block.section}: not printed"
            continue
        if block.language == "bash":
            command = ["bash", "-e", "-o", "pipefail", "-c", block.text.replace(SERVER, served)]
        elif block.language == "python":
            command = [sys.executable, "-c", block.text]
        else:
            continue
        done = subprocess.run(
            command, cwd=work, env=env, capture_output=True, text=True, timeout=900
        )
        assert done.returncode == 0, f"{block.section}:\n{block.text}\n{done.stderr[-4000:]}"
        output = _flat(done.stdout)
        ran.append(block.section)
        if block.language == "bash" and served in command[-1]:
            _cancel_unfinished(served)
    # steps 1 to 4: the checkpoint, its exports (local and through the server), running
    # the artifacts, the encoder-decoder model
    assert [section[:2] for section in dict.fromkeys(ran)] == ["1.", "2.", "3.", "4."]
    jobs = httpx.get(f"{served}/v1/exports", timeout=10).json()["items"]
    # `torchport submit` and curl each started a job on the server
    assert len(jobs) == 2
    assert all(job["model_name"] == "tiny-llama.zip" for job in jobs)
    assert (work / "llama-out" / "model.pte").is_file()
    assert (work / "t5-out" / "encoder.pt2").is_file()
