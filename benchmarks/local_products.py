"""One truncated block-local product before and after the sparse kept pairs (issue 47).

For ``n`` uniform points in ``[0, 1]^3`` per side at ``reg``: ``LocalGaussianExpansion(reg,
tau=4, rtol=2e-4, truncate=2e-4, rng=0)`` (what ``polyts_local`` picks at 10^6 points for a
loss at accuracy 1e-2: ``rtol_for(1e-2) = 2e-4``, tau 4, degree 10, ``R = 286``), then
``log_matvec`` on two weightings: uniform (``log_v = 0``) and a Sinkhorn-like scaling
(``log_v = -0.9 ||y - 1/2||^2 / reg + 3 N(0, 1)``, spanning hundreds of orders of magnitude).
Each product is timed ``--repeats`` times (best wall and best process CPU seconds kept: the
machine is shared, and CPU time is the steadier under load); its max relative error against the
exact log-sum-exp on ``--check-rows`` sampled rows is printed next to the certified bound
``entry_error_bound_ + truncate``, with the counted work of one iteration
(``iteration_work()['fma']``).

"before" runs the code of ``--baseline`` (a clean clone of the commit before the change),
"after" this checkout, each in its own process started from ``/tmp`` (so that the current
folder does not shadow ``PYTHONPATH``), one after the other in the same run, with
``os.getloadavg()`` recorded around each. Writes ``results/local_products.json`` and ``.md``.
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


def worker(n: int, reg: float, repeats: int, check_rows: int) -> dict:
    """The measures of one code version (runs in a child process)."""
    from sketchot.gibbs import gibbs_log_matvec
    from sketchot.sketch.local import LocalGaussianExpansion

    rng = np.random.default_rng(0)
    X, Y = rng.random((n, 3)), rng.random((n, 3))
    start = time.perf_counter()
    kernel = LocalGaussianExpansion(reg, tau=4.0, rtol=2e-4, truncate=2e-4, rng=0).fit(X, Y)
    record = {
        "fit_s": time.perf_counter() - start,
        "degree": kernel.degree_,
        "clusters": list(kernel.n_clusters_),
        "bound": kernel.entry_error_bound_ + kernel.truncate,
        "iteration_fma": kernel.iteration_work()["fma"],
    }
    weights = {
        "uniform": np.zeros(n),
        "scaled": -0.9 * np.sum((Y - 0.5) ** 2, axis=1) / reg + 3.0 * rng.standard_normal(n),
    }
    rows = rng.choice(n, check_rows, replace=False)
    for name, log_v in weights.items():
        times, cpu, load = [], [], [os.getloadavg()]
        for _ in range(repeats):
            start, start_cpu = time.perf_counter(), time.process_time()
            result = kernel.log_matvec(log_v)
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        load.append(os.getloadavg())
        exact = gibbs_log_matvec(X[rows], Y, reg, log_v)  # blocked: O(rows) memory
        record[name] = {
            "seconds": min(times),
            "all_seconds": times,
            "cpu_seconds": min(cpu),
            "all_cpu_seconds": cpu,
            "max_rel_error": float(np.max(np.abs(np.expm1(result[rows] - exact)))),
            "loadavg": load,
        }
    return record


def run(code: Path, n: int, reg: float, repeats: int, check_rows: int) -> dict:
    """:func:`worker` in a child process importing sketchot from ``code``."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", str(n), str(reg)]
    argv += ["--repeats", str(repeats), "--check-rows", str(check_rows)]
    done = subprocess.run(argv, env=env, cwd="/tmp", check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=float, nargs="+", default=[1e5, 1e6])
    parser.add_argument("--reg", type=float, default=0.01)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--check-rows", type=int, default=200)
    parser.add_argument("--baseline", type=Path, default=Path("/tmp/baseline"))
    parser.add_argument("--out", default="local_products")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        record = worker(int(float(args.worker[0])), float(args.worker[1]), args.repeats,
                        args.check_rows)  # fmt: skip
        print(json.dumps(record))
        return

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _results import md_table, write_json, write_text

    cases = []
    for n in (int(x) for x in args.n):
        for label, code in (("before", args.baseline), ("after", ROOT)):
            record = run(code, n, args.reg, args.repeats, args.check_rows)
            cases.append({"n": n, "reg": args.reg, "code": label, **record})
            print(json.dumps(cases[-1]), flush=True)
    rows = []
    for case in cases:
        before = next(c for c in cases if c["n"] == case["n"] and c["code"] == "before")
        for name in ("uniform", "scaled"):
            seconds = case[name]["seconds"]
            rows.append(
                (
                    f"{case['n']:.0e}",
                    case["code"],
                    name,
                    f"{seconds:.2f}",
                    f"{before[name]['seconds'] / seconds:.2f}",
                    f"{case[name]['cpu_seconds']:.2f}",
                    f"{before[name]['cpu_seconds'] / case[name]['cpu_seconds']:.2f}",
                    f"{case['iteration_fma']:.3g}",
                    f"{case[name]['max_rel_error']:.2e}",
                    f"{case['bound']:.2e}",
                    "/".join(f"{x:.1f}" for x in case[name]["loadavg"][-1]),
                )
            )
    header = ("n", "code", "log_v", "product s", "speed-up", "cpu s", "cpu speed-up",
              "iteration fma", "max rel err", "bound", "loadavg after")  # fmt: skip
    now = time.gmtime()
    lines = [
        f"# One truncated block-local product, uniform [0, 1]^3, reg {args.reg}",
        "",
        f"`python benchmarks/local_products.py` ({time.strftime('%Y-%m-%d %H:%M UTC', now)},"
        f" best of {args.repeats}; before = {args.baseline}, after = this checkout; tau 4, "
        "rtol = truncate = 2e-4; speed-up = before's seconds / this row's, same n and weights)",
        "",
        *md_table(header, rows, "rllrrrrrrrr"),
        "",
    ]
    write_text(RESULTS / f"{args.out}.md", "\n".join(lines))
    write_json(RESULTS / f"{args.out}.json", {"cases": cases, "argv": sys.argv})
    print("\n".join(lines))


if __name__ == "__main__":
    main()
