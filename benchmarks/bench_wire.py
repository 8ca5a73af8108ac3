"""The command wire per message, beside pickle of the same messages measured in the same run.

Each row encodes and decodes a body the way master and worker do (wire.encode_body and
wire.decode_body or iter_body), in a fresh process, CPU time, best of several rounds: a
64-command batch of Calls and Frees whose arguments hold Refs, slices, axis tuples and a
NumPy scalar; the same without nested arguments; one Call; a Done reply; a 4096-command
graph body read by iter_body. Its baseline is pickle (protocol 5) of the same message list,
dumped and loaded in another fresh process: the fast format the wire refuses to be, as
unpickling runs code. Speed is measured, never asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

ROWS = ["batch of 64, nested args", "batch of 64, flat args", "one Call", "Done reply",
        "graph body of 4096 (iter_body)"]


def _messages(row: str) -> list:
    import numpy as np

    from mwrt.protocol import wire

    ref = wire.Ref
    mixed = [wire.Call(i, -1, (1000 + i,), "add", (ref(i), ref(i + 1)), {}) if i % 8 < 4 else
             wire.Call(i, -1, (1000 + i,), "sum", (ref(i),), {"axis": (0, 1)}) if i % 8 == 4 else
             wire.Call(i, -1, (1000 + i,), "getitem", (ref(i), (slice(0, 4), 2)), {})
             if i % 8 == 5 else
             wire.Call(i, -1, (1000 + i,), "multiply", (ref(i), np.float32(0.5)), {})
             if i % 8 == 6 else wire.Free(i, -1, (i, i + 1), 1) for i in range(4096)]
    flat = [m for m in mixed if not isinstance(m, wire.Call) or m.op == "add"]
    return {ROWS[0]: mixed[:64], ROWS[1]: flat[:64], ROWS[2]: mixed[:1],
            ROWS[3]: [wire.Done(3, None)], ROWS[4]: mixed}[row]


def measure(row: str, how: str, rounds: int = 7) -> float:
    """Microseconds of CPU per message to encode and decode `row`'s body by `how`."""
    import pickle

    from mwrt.protocol import wire

    messages = _messages(row)
    if how == "pickle":
        def once():
            pickle.loads(pickle.dumps(messages, protocol=5))
    elif row == ROWS[4]:
        def once():
            list(wire.iter_body(wire.encode_body(messages)))
    else:
        def once():
            wire.decode_body(wire.encode_body(messages))
    reps = max(1, 40_000 // len(messages) // (7 // rounds))
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(reps):
            once()
        best = min(best, (time.process_time() - start) / reps / len(messages))
    return best * 1e6


def _fresh(row: str, how: str, rounds: int) -> float:
    code = (f"import bench_wire, json; "
            f"print(json.dumps(bench_wire.measure({row!r}, {how!r}, {rounds})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.abspath(__file__)), timeout=300,
                         env={**os.environ, "PYTHONPATH": ROOT})
    return json.loads(out.stdout)


def main() -> None:
    rounds = 1 if "--quick" in sys.argv[1:] else 7  # --quick: one short round (a smoke run)
    print(f"{'encode + decode, per message':34s} {'mwrt wire':>10s} {'pickle':>10s} {'ratio':>6s}")
    for row in ROWS:
        ours, base = _fresh(row, "wire", rounds), _fresh(row, "pickle", rounds)
        print(f"{row:34s} {ours:8.2f} us {base:8.2f} us {ours / base:6.2f}")


if __name__ == "__main__":
    main()
