# Hostile: write a report of its own, tell the worker it is done, and keep running (a
# thread spinning, the main thread asleep). The worker takes the outputs, and must stop
# the job rather than wait for an exit that would come only at its timeout.
import os
import threading
import time

from schemas import ErrorBody, ReportDocument
from schemas.report import Environment

TARGETS = {}
OUT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isdir(os.path.join(OUT, "out")):  # the job's staging directory
    OUT = os.path.dirname(OUT)
report = ReportDocument(
    status="failed",
    error=ErrorBody(code="internal_error", message="EARLY-DONE"),
    environment=Environment(torchport="forged", python="3", platform="forged"),
    duration_s=0.0,
)
with open(os.path.join(OUT, "out", "report.json"), "w") as handle:
    handle.write(report.model_dump_json())
print("BEFORE-DONE", flush=True)
os.write(3, b'{"done": true}\n')
threading.Thread(target=lambda: any(iter(int, 1)), daemon=True).start()  # spins, holds nothing
time.sleep(300)
