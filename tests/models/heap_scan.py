# Tenant A: read every readable page of this job's own address space (the ranges
# /proc/self/maps lists, read in place: a non-dumpable process may not open its own
# /proc/self/mem) and print each distinct string of the test's secret pattern it holds.
# The pattern written here never matches itself; only strings built at run time do.
import ctypes
import json
import re

PATTERN = re.compile(rb"qz[0-9a-f]{20}zq")
SPECIAL = ("[vvar]", "[vvar_vclock]", "[vsyscall]")  # the kernel's pages, not the process's

with open("/proc/self/maps") as maps:
    lines = maps.read().splitlines()
found = set()
regions = scanned = 0
for line in lines:
    fields = line.split()
    if not fields[1].startswith("r") or (len(fields) > 5 and fields[5] in SPECIAL):
        continue
    start, end = (int(x, 16) for x in fields[0].split("-"))
    pages = memoryview((ctypes.c_char * (end - start)).from_address(start)).cast("B")
    found.update(m.group().decode() for m in PATTERN.finditer(pages))
    regions += 1
    scanned += end - start
print("HEAPSCAN" + json.dumps([sorted(found), regions, scanned]) + "HEAPSCAN")
raise RuntimeError("scanned")
