# Hostile: abuse the round-trip pipes to the zygote (fd 4 requests, fd 5 answers):
# a payload with no loader, a loader on a file outside the job, too many loaders,
# then a request line too long for the zygote. Every answer must be a refusal.
import json, os
import torch

TARGETS = {}


def ask(*lines):
    os.write(4, b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    answer = b""
    while not answer.endswith(b"\n"):
        chunk = os.read(5, 65536)
        if not chunk:
            break
        answer += chunk
    return json.loads(answer) if answer else None


sibling = {"pt2": TARGETS["sibling_file"], "payload": TARGETS["sibling_file"]}
answers = [
    ask({"payload": TARGETS["secret_file"]}),
    ask({"pt2": TARGETS["secret_file"], "threads": 10**9, "payload": TARGETS["secret_file"]}),
    ask(sibling),
    ask(sibling),
    ask(sibling),
    ask(sibling),
]
summary = [(a or {}).get("status") for a in answers] + [(answers[0] or {}).get("reason")]
summary.append((answers[-1] or {}).get("reason"))
print("ANSWERS" + json.dumps(summary) + "ANSWERS", flush=True)
os.write(4, b"x" * (1 << 15))  # no newline, over the zygote's limit: it kills the job
raise RuntimeError("the round-trip pipes gave nothing away")


class Model(torch.nn.Module):
    def forward(self, x):
        return x
