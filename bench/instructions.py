"""Instructions per call: opto.evaluate against the aiohttp floor, counted by valgrind.

CPU time on a shared 2-core machine drifts by tens of percent between runs, so a change of
a few percent to opto's path cannot be seen in `bench/evaluate.py`'s timings. Instructions
can: this runs each client's measured calls under valgrind's callgrind (instrumented only
around the measured run, switched on and off with `callgrind_control`), against the same
fake server in its own process, and prints the instructions each call costs. Two runs of
the same code agree to about 0.5%.

Instructions are not time: opto's run also waits on memory more (the garbage collector
walks the calls in flight), so the CPU ratio in `bench/evaluate.py` is higher than the
instruction ratio. Needs valgrind (`apt-get install valgrind`).

    python bench/instructions.py               # about a minute
    python bench/instructions.py --calls 2000
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile

from evaluate import client_runs
from fake_server_process import fake_server

KINDS = ("aiohttp", "opto")
CONCURRENCY = 64


def _child(kind: str, calls: int) -> None:
    """Under valgrind: warm up, then count only the measured run."""
    with fake_server(True) as server:
        server.set_latency(0.05)
        run, model = client_runs(kind, server.base_url, CONCURRENCY)
        run(CONCURRENCY)  # lazy imports and the connection pool, not counted
        gc.collect()
        subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], capture_output=True, check=False)
        run(calls)
        subprocess.run(["callgrind_control", "-i", "off", str(os.getpid())], capture_output=True, check=False)
        if model is not None:
            model.close()


def count(kind: str, calls: int) -> int:
    """Instructions the measured run of `kind` took (this process's, not the server's)."""
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={folder}/out.%p"]
            + [sys.executable, os.path.abspath(__file__), "--child", kind, str(calls)],
            capture_output=True,
            text=True,
            check=True,
        )
    counted = [int(n) for n in re.findall(r"Collected : (\d+)", done.stderr) if int(n) > 0]
    if len(counted) != 1:
        raise RuntimeError(f"expected one instrumented process, valgrind said:\n{done.stderr[-2000:]}")
    return counted[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--child", nargs=2, metavar=("KIND", "CALLS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child[0], int(args.child[1]))
        return 0
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed: apt-get install valgrind", file=sys.stderr)
        return 1
    print(f"{args.calls} one-call rollouts at concurrency {CONCURRENCY}, server latency 50 ms (own process)")
    print("| client | instructions per call | / floor |")
    print("|---|---:|---:|")
    found = {kind: count(kind, args.calls) / args.calls for kind in KINDS}
    for kind in KINDS:
        print(f"| {kind} | {found[kind]:,.0f} | {found[kind] / found['aiohttp']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
