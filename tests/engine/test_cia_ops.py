"""engine.decompose.cia_ops: torch's CIA-op walk kept while the dispatcher does not change.

Each case runs in a fresh interpreter: installing patches torch for the whole process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).parents[2]

PRELUDE = """
import json
import torch
import torch._export.utils as utils
import torch.export.decomp_utils as decomp_utils
import torch.export.exported_program as exported_program
from engine.decompose import cia_ops

walk = utils._collect_all_valid_cia_ops
found = {}

def export_once():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    torch.export.export(model, (torch.randn(2, 4),)).run_decompositions()
"""


def run(body: str, before: str = "") -> dict:
    """`before`, then install() and `body`; what they put in `found`."""
    script = (
        PRELUDE
        + textwrap.dedent(before)
        + "\nfresh = walk()\nassert cia_ops.install()\n"
        + textwrap.dedent(body)
        + "\nprint(json.dumps(found))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_kept_answer_is_torchs_and_survives_exports() -> None:
    found = run(
        """
        found["patched"] = [
            m._collect_all_valid_cia_ops is not walk
            for m in (utils, decomp_utils, exported_program)
        ]
        found["same"] = utils._collect_all_valid_cia_ops() == fresh == walk()
        found["size"] = len(fresh)
        export_once()
        export_once()
        found["walks"] = cia_ops.walks()
        found["same_after"] = utils._collect_all_valid_cia_ops() == walk()
        """,
        # torch's first export imports the modules that register prims, c10d, onnx, …
        before="export_once()",
    )
    assert found["patched"] == [True, True, True]
    assert found["same"] and found["size"] > 100
    # run_decompositions puts Python CIA kernels on the ops it preserves and takes them
    # back: no walk for that
    assert found["walks"] == 0 and found["same_after"]


def test_the_first_export_after_a_cold_import_walks_once() -> None:
    found = run("export_once(); found['first'] = cia_ops.walks(); export_once()")
    # what torch's first export registers (prims, c10d, …) changes the answer, once
    assert found == {"first": 1}
    assert run("export_once(); export_once(); found['walks'] = cia_ops.walks()") == {"walks": 1}


def test_a_new_custom_op_with_a_cia_kernel_is_seen_after_one_walk() -> None:
    found = run(
        """
        lib = torch.library.Library("tpjob", "DEF")
        lib.define("twice(Tensor x) -> Tensor")
        lib.impl("twice", lambda x: x * 2, "CompositeImplicitAutograd")
        found["seen"] = torch.ops.tpjob.twice.default in utils._collect_all_valid_cia_ops()
        found["same"] = exported_program._collect_all_valid_cia_ops() == walk()
        found["walks"] = cia_ops.walks()
        """
    )
    assert found == {"seen": True, "same": True, "walks": 1}


def test_a_cia_kernel_registered_for_an_existing_op_is_seen() -> None:
    found = run(
        """
        op = torch.ops.tpexisting.plain.default
        found["before"] = op in utils._collect_all_valid_cia_ops()
        lib.impl("plain", lambda x: x + 1, "CompositeImplicitAutograd")
        found["after"] = op in decomp_utils._collect_all_valid_cia_ops()
        found["walks"] = cia_ops.walks()
        """,
        before="""
        # an op that exists before install(), with a CPU kernel and no CIA kernel
        lib = torch.library.Library("tpexisting", "DEF")
        lib.define("plain(Tensor x) -> Tensor")
        lib.impl("plain", lambda x: x + 1, "CPU")
        """,
    )
    assert found == {"before": False, "after": True, "walks": 1}


def test_a_python_cia_kernel_on_an_op_outside_the_answer_is_seen() -> None:
    found = run(
        """
        lib = torch.library.Library("tppython", "DEF")
        lib.define("plain(Tensor x) -> Tensor")
        op = torch.ops.tppython.plain.default
        utils._collect_all_valid_cia_ops()  # one walk for the new op's name
        lib.impl("plain", lambda x: x + 1, "CPU")  # the op has a kernel, none of them CIA
        found["before"] = op in utils._collect_all_valid_cia_ops()
        op.py_impl(torch._C.DispatchKey.CompositeImplicitAutograd)(lambda x: x + 1)
        found["after"] = op in utils._collect_all_valid_cia_ops()
        found["same"] = utils._collect_all_valid_cia_ops() == walk()
        found["walks"] = cia_ops.walks()
        """
    )
    # names changed (1), the CPU kernel changed no list the cache compares but the answer
    # stays right (the op is not CIA), the Python CIA kernel (2)
    assert found == {"before": False, "after": True, "same": True, "walks": 2}
