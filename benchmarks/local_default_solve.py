"""The default solve at small reg on uniform points, before and after a change (issue 47).

``sketchot.sinkhorn(None, None, X, Y, reg, rng=0)`` (``backend='auto'``, the default accuracy
1e-3) on ``n`` uniform points in ``[0, 1]^3`` per side: at 10^5 points and reg 0.003 the
policy picks ``polyts_local`` (tau 4, degree 11, truncate 2e-5). Each code version runs in its
own child process started from ``/tmp`` (so that the current folder does not shadow
``PYTHONPATH``), one after the other in the same run: "before" the code of ``--baseline`` (a
clean clone of the commit before the change), "after" this checkout. Recorded per run: wall
and process CPU seconds of the solve, the backend and its parameters, the iterations, the
certified true-kernel error (upper bound of the relative L1 marginal error) and whether it met
the accuracy, and the block-local products (count, wall and CPU seconds, split by log-domain
products and the rest) timed by wrapping ``LocalGaussianExpansion._apply``; with
``os.getloadavg()`` before and after. The machine is shared: CPU seconds are the steadier
measure under load. Writes ``results/<out>.json`` and ``.md``.

    python benchmarks/local_default_solve.py                   # 1e5 points, reg 0.003
    python benchmarks/local_default_solve.py --n 1e6 --reg 0.01 --codes after
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]


def worker(n: int, reg: float) -> dict:
    """One default solve with its products timed (runs in a child process)."""
    import sketchot
    from sketchot.sketch.local import expansion

    products: list[tuple[bool, float, float]] = []
    original = expansion.LocalGaussianExpansion._apply

    def timed(self, out, inn, log_w, values, truncate=0.0, **options):
        start, start_cpu = time.perf_counter(), time.process_time()
        try:
            return original(self, out, inn, log_w, values, truncate, **options)
        finally:
            seconds, cpu = time.perf_counter() - start, time.process_time() - start_cpu
            products.append((values is None and truncate > 0, seconds, cpu))

    expansion.LocalGaussianExpansion._apply = timed
    rng = np.random.default_rng(0)
    X, Y = rng.random((n, 3)), rng.random((n, 3))
    load = [os.getloadavg()]
    start, start_cpu = time.perf_counter(), time.process_time()
    res = sketchot.sinkhorn(None, None, X, Y, reg, rng=0)
    seconds, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    load.append(os.getloadavg())
    logs = [p for p in products if p[0]]
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "backend": res.backend,
        "params": {k: v for k, v in res.kernel.info.params.items() if k != "clusters"},
        "clusters": list(res.kernel.info.params.get("clusters", ())),
        "n_iter": res.n_iter,
        "error": res.true_kernel.bound,
        "accuracy_met": bool(res.accuracy_met),
        "coarse_seconds": (res.iteration_info.get("coarse_to_fine") or {}).get("seconds"),
        "log_products": len(logs),
        "log_product_seconds": sum(p[1] for p in logs),
        "log_product_cpu": sum(p[2] for p in logs),
        "other_products": len(products) - len(logs),
        "other_product_cpu": sum(p[2] for p in products if not p[0]),
        "loadavg": load,
    }


def run(code: Path, n: int, reg: float) -> dict:
    """:func:`worker` in a child process importing sketchot from ``code``."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", str(n), str(reg)]
    done = subprocess.run(argv, env=env, cwd="/tmp", check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=float, default=1e5)
    parser.add_argument("--reg", type=float, default=0.003)
    parser.add_argument("--codes", nargs="+", default=["before", "after"])
    parser.add_argument("--baseline", type=Path, default=Path("/tmp/baseline"))
    parser.add_argument("--out", default=None)
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(int(float(args.worker[0])), float(args.worker[1]))))
        return

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _results import md_table, write_json, write_text

    n = int(args.n)
    codes = {"before": args.baseline, "after": ROOT}
    cases = []
    for label in args.codes:
        record = run(codes[label], n, args.reg)
        cases.append({"n": n, "reg": args.reg, "code": label, **record})
        print(json.dumps(cases[-1]), flush=True)
    before = next((c for c in cases if c["code"] == "before"), None)
    rows = []
    for case in cases:
        per_product = case["log_product_cpu"] / max(case["log_products"], 1)
        rows.append(
            (
                case["code"],
                case["backend"],
                f"{case['params'].get('tau', '-')}",
                f"{case['seconds']:.1f}",
                f"{case['cpu_seconds']:.1f}",
                f"{before['cpu_seconds'] / case['cpu_seconds']:.2f}" if before else "-",
                str(case["n_iter"]),
                f"{case['log_products']} / {case['log_product_cpu']:.1f} / {per_product:.2f}",
                f"{case['error']:.2e}",
                str(case["accuracy_met"]),
                "/".join(f"{x:.1f}" for x in case["loadavg"][0]),
                "/".join(f"{x:.1f}" for x in case["loadavg"][-1]),
            )
        )
    header = ("code", "backend", "tau", "wall s", "cpu s", "cpu speed-up", "iterations",
              "log products: count / cpu s / cpu s each", "certified error", "met",
              "load before", "load after")  # fmt: skip
    now = time.gmtime()
    lines = [
        f"# Default solve, {n:.0e} uniform points in [0, 1]^3 per side, reg {args.reg}",
        "",
        f"`python benchmarks/local_default_solve.py --n {args.n:g} --reg {args.reg}` "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', now)}; before = {args.baseline}, after = "
        "this checkout, each in its own process, one after the other; backend='auto', "
        "accuracy 1e-3; cpu = process CPU seconds, both threads; speed-up = before's cpu / "
        "this row's)",
        "",
        *md_table(header, rows, "lllrrrrrrlrr"),
        "",
    ]
    out = args.out or f"local_default_solve_{n:.0e}_reg{args.reg:g}".replace("+", "")
    write_text(RESULTS / f"{out}.md", "\n".join(lines))
    write_json(RESULTS / f"{out}.json", {"cases": cases, "argv": sys.argv})
    print("\n".join(lines))


if __name__ == "__main__":
    main()
