"""Mean TTFT and ITL between two scrapes of radixserve's /metrics (used by bench_frontend.sh).

Usage: python metrics_delta.py BEFORE.txt AFTER.txt
"""

import re
import sys


def sums(path: str) -> dict[str, float]:
    values = {}
    for line in open(path):
        m = re.match(r"radixserve:(time_to_first_token|inter_token_latency)_seconds_(sum|count)"
                     r"\{[^}]*\} (\S+)", line)
        if m:
            values[f"{m[1]}_{m[2]}"] = float(m[3])
    return values


before, after = sums(sys.argv[1]), sums(sys.argv[2])
out = []
for name, label in (("time_to_first_token", "TTFT"), ("inter_token_latency", "ITL")):
    count = after[f"{name}_count"] - before.get(f"{name}_count", 0)
    total = after[f"{name}_sum"] - before.get(f"{name}_sum", 0)
    out.append(f"{label} mean {total / count * 1000:.2f} ms" if count else f"{label} -")
print("  ".join(out))
