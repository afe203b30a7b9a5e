"""Nothing of one tenant's job is in the memory a later job inherits (docs/sandbox.md,
"What a job inherits"): tenant B's jobs carry secrets in their upload's file name, their
symbol, an option (a dim name), their output's key (which the round trip's loader answer
carries) and a flag of a toolchain request (which passes the zygote as bytes); tenant A's
next job reads every readable page of its own address space and says which strings of
the secrets' pattern it found. Run with fresh forks and with every job in a spare; the
scanner's own file name, found in its own memory, shows that the scan sees what is there.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

from tests.sandbox.conftest import MODELS, Arena
from worker.sandbox.zygote.relay import Relay

ROUNDS = 4


def _token() -> str:
    """A secret string of the pattern heap_scan.py looks for (`qz` + 20 hex + `zq`)."""
    return "qz" + os.urandom(10).hex() + "zq"


def _upload(arena: Arena, template: str, name: str, **secrets: str) -> Path:
    text = (MODELS / template).read_text()
    for key, value in secrets.items():
        text = text.replace(key, value)
    path = Path(tempfile.mkdtemp(dir=arena.root)) / name
    path.write_text(text)
    return path


def _tenant_b_job(arena: Arena) -> dict[str, str]:
    """Run one export of tenant B's; the secrets it carried (token: where)."""
    file, symbol, dim, output, flag = (_token() for _ in range(5))
    symbol, dim, output, flag = f"Net_{symbol}", f"d_{dim}", f"out_{output}", f"F_{flag}"
    model = _upload(
        arena,
        "heap_tenant.py",
        f"tenant_{file}.py",
        SECRET_SYMBOL=symbol,
        SECRET_OUTPUT=output,
        SECRET_FLAG=flag,
    )
    options: dict[str, object] = {
        "symbol": symbol,
        "dynamic_shapes": {"x": {"0": {"name": dim, "min": 2}}},
    }
    result, _, _ = arena.run(model, options=options)
    assert result.report.status == "succeeded", result.error
    assert result.report.verification is not None
    roundtrip = result.report.verification.roundtrip
    assert roundtrip is not None and roundtrip.status == "passed"
    # The loader's answer named the output: a secret went through the round trip.
    assert any(output in o.path for o in roundtrip.outputs), roundtrip.outputs
    denied = [w for w in result.report.warnings if w.code == "sandbox_denied"]
    assert denied and "subprocess.Popen" in denied[0].details["attempted"]  # it was asked
    return {
        file: "file name",
        symbol[4:]: "symbol",
        dim[2:]: "option",
        output[4:]: "output",
        flag[2:]: "toolchain request",
    }


def _tenant_a_scan(arena: Arena) -> tuple[set[str], str, int]:
    """Run tenant A's scanning job; the pattern's strings it found, its own file name's
    token, and how many bytes it read."""
    own = _token()
    result, _, job_dir = arena.run(_upload(arena, "heap_scan.py", f"scan_{own}.py"))
    log = (job_dir / "sandbox.log").read_text(errors="replace")
    seen = re.search(r"HEAPSCAN(.*?)HEAPSCAN", log)
    assert seen is not None, (result.error, log[-3000:])
    found, regions, scanned = json.loads(seen.group(1))
    assert regions > 100
    return set(found), own, scanned


def test_a_job_inherits_nothing_of_another_tenants_jobs(each_arena: Arena) -> None:
    secrets: dict[str, str] = {}
    for _ in range(ROUNDS):
        secrets.update(_tenant_b_job(each_arena))
        found, own, scanned = _tenant_a_scan(each_arena)
        assert own in found  # its own upload's name is in its memory, and the scan saw it
        assert scanned > 200 << 20  # torch's libraries and the zygote's heap, at least
        assert [secrets[t] for t in found if t in secrets] == []


def test_a_relayed_line_is_passed_on_as_it_came_and_then_zeroed() -> None:
    line = b'{"status": "passed", "outputs": [{"path": "secret"}]}\n'
    loader_r, loader_w = os.pipe()
    job_r, job_w = os.pipe()
    try:
        relay = Relay(64)
        os.write(loader_w, line[:10])
        assert relay.read_from(loader_r) == 10
        assert relay.line_length() == 0 and not relay.pass_on(job_w)  # no line yet
        os.write(loader_w, line[10:] + b"more")
        relay.read_from(loader_r)
        assert relay.line_length() == len(line)
        assert relay.pass_on(job_w)
        assert os.read(job_r, 1024) == line  # the first line only, byte for byte
        relay.clear()
        assert (relay.length, relay.buffer) == (0, bytearray(64))
        # A line longer than the buffer is never passed on.
        os.write(loader_w, b"x" * 70 + b"\n")
        while relay.read_from(loader_r):
            pass
        assert relay.full and not relay.pass_on(job_w)
    finally:
        for fd in (loader_r, loader_w, job_r, job_w):
            os.close(fd)
