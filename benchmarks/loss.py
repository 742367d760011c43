"""The Sinkhorn divergence as a loss: correctness of value and gradient, and time per step.

Data: uniform points in ``[0, 1]^3`` (``X`` and ``Y`` drawn independently from
``default_rng(seed)``; ``--data colours``: the RGB colours in ``[0, 1]^3`` of pixels drawn
with replacement from ``images/default_source.png`` and ``default_target.png``), uniform
weights, ``reg`` absolute (0.1 and 0.01), squared Euclidean
cost, the balanced debiased divergence ``S = OT(a, b) - OT(a, a) / 2 - OT(b, b) / 2`` with
``OT`` the entropic objective (``<P, C> + reg KL(P | a b^T)``, POT's ``value``).

Correctness (``n = --n-ref`` per side, default 2000): against a float64 log-domain dense
reference computed here (alternate log-sum-exp updates for the cross problem, the averaged
symmetric update ``f <- (f + T(f)) / 2`` for the symmetric ones, to ``1e-12`` on the
potentials; value from the dense plan, gradients from the dense plans by the envelope
formulas of :mod:`sketchot.loss`): ``sketchot.sinkhorn_divergence`` with the exact backend
(``tol=1e-12``) and with the defaults (``backend='auto'``, ``accuracy=1e-3``). Reported: the
value's absolute error next to its own ``value_error`` estimate, the relative L2 errors of
``grad_X`` and ``grad_a``, and the certified true-kernel marginal error of the three solves.
Also at this size: GeomLoss (``tensorized``, ``scaling`` 0.5 and 0.9, where installed; its
value and gradient times 2, its cost being ``||x - y||^2 / 2`` at ``blur = sqrt(reg / 2)``)
and POT (below).

Speed (``n = --n`` per side, default 1e4): loss plus gradient per step of a short gradient flow
``X <- X - lr n grad_X`` (``lr = 0.05``: each point moves 10% of the way to its barycentric
target) for

``sketchot cold``
    ``sketchot.sinkhorn_divergence(X, Y, reg=reg, rng=seed)`` (``backend='auto'``) on each
    step's clouds, from scratch.
``sketchot warm``
    ``sketchot.SinkhornDivergence(reg=reg, rng=seed)`` called on the same clouds: from the
    previous step's potentials and kernel choice when they still meet the accuracy.
``POT``
    ``ot.solve_sample(X, Y, reg=reg, debias=True, tol=1e-6)`` on torch float64 tensors with
    ``grad='envelope'`` and ``.backward()`` (dense ``n x n``: loss and gradient), step 0
    only.
``GeomLoss``
    ``SamplesLoss('sinkhorn', p=2, blur=sqrt(reg / 2), scaling=s, backend=b)`` with ``b`` in
    ``online`` and ``multiscale`` (KeOps, float64 tensors, compiled before the timed call)
    and ``s`` in 0.5 and 0.9, value and ``.backward()``, on the first step's clouds and,
    where the last step has a reference (below), on the last step's.

each with its gradient's relative L2 error against sketchot's exact backend at ``tol=1e-9``
(the reference at this size) on the first step's clouds, and for sketchot's cold and warm
calls also on the last step's (``--no-check-last``: not). Each timed sketchot step reads
``grad_X`` (computed when first read), as the peers' steps run their backward pass. Times
are one run each on a shared 2-core machine: noisy.

    python benchmarks/loss.py --quick   # n-ref 1000 reg 0.1 (POT too); n 1e4 reg 0.1, 3
                                        # steps, without the exact reference and POT there
    python benchmarks/loss.py           # n-ref 2000 and n 1e4 at reg 0.1 and 0.01, 5 steps
    python benchmarks/loss.py --n 100000 --regs 0.01 --steps 10 --cold-every 10 --n-ref 0 \
        --reference accurate --peers multiscale:0.5 multiscale:0.9 --out loss_1e5
    python benchmarks/loss.py --n 100000 --regs 0.01 --steps 50 --cold-every 10 --n-ref 0 \
        --reference accurate --peers multiscale:0.5 multiscale:0.9 --out loss_flow50_1e5

    python benchmarks/loss.py --data colours --n 1000000 --regs 0.01 --steps 4 \
        --cold-every 4 --no-cold-last --n-ref 0 --no-pot --peers --accuracy 1e-2 \
        --out loss_colours_1e6

``--cold-every K`` solves the flow from scratch at every K-th step only (and at the last): the
from-scratch total is then estimated as the measured cold steps' mean times the steps.

``--reference accurate`` measures the gradient errors against the default call at
``accuracy=1e-6`` (certified by its true-kernel check) where the exact kernel's passes are too
slow; ``--peers`` picks GeomLoss's backends (``online`` is quadratic: hours at 1e5 on two
cores); ``--n-ref 0`` leaves the correctness cells out.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from _results import md_table, timed, write_json, write_text
from scipy.special import logsumexp

import sketchot

RESULTS_DIR = Path(__file__).resolve().parent / "results"
IMAGES = Path(__file__).resolve().parents[1] / "images"
DATA = {
    "uniform": "uniform [0, 1]^3",
    "colours": "the default images' pixel colours",
    "gaussian10": "Gaussian clouds in d = 10",
}
LR = 0.05
REF_TOL = 1e-12
# GeomLoss's CPU backends at the speed size (KeOps): (backend, scaling)
GEOMLOSS_PEERS = (("online", 0.5), ("online", 0.9), ("multiscale", 0.5), ("multiscale", 0.9))


def read_grad_X(result):  # noqa: N802 (the cloud's name)
    """``result`` after reading its ``grad_X`` (computed on first read: the timed step
    includes it, as the peers' timings include their backward pass; ``grad_Y``, which the
    flow does not use, is not computed)."""
    result.grad_X  # noqa: B018
    return result


# ---------------------------------------------------------------- dense reference
def _sq_dist(P: np.ndarray, Q: np.ndarray) -> np.ndarray:
    return np.maximum((P**2).sum(1)[:, None] + (Q**2).sum(1)[None, :] - 2.0 * P @ Q.T, 0.0)


def _dense_problem(P, Q, a, b, reg, symmetric):
    """Potentials ``(f, g)`` and the dense plan of one problem, float64 log domain."""
    C = _sq_dist(P, Q)
    log_a, log_b = np.log(a), np.log(b)
    f, g = np.zeros(len(a)), np.zeros(len(b))
    for _ in range(100_000):
        if symmetric:  # the averaged symmetric iteration: f = g throughout
            new = 0.5 * (f - reg * logsumexp(log_a[None, :] + (f[None, :] - C) / reg, axis=1))
            done = np.abs(new - f).max() < REF_TOL
            f = g = new
        else:
            f = -reg * logsumexp(log_b[None, :] + (g[None, :] - C) / reg, axis=1)
            new = -reg * logsumexp(log_a[:, None] + (f[:, None] - C) / reg, axis=0)
            done = np.abs(new - g).max() < REF_TOL
            g = new
        if done:
            break
    log_ratio = (f[:, None] + g[None, :] - C) / reg  # log(P / a b^T)
    plan = np.exp(log_a[:, None] + log_b[None, :] + log_ratio)
    value = float((plan * C).sum() + reg * ((plan * log_ratio).sum() - plan.sum() + 1.0))
    return f, g, plan, value


def dense_reference(X, Y, reg):
    """Value and gradients of the balanced divergence from dense float64 plans."""
    n, m = len(X), len(Y)
    a, b = np.full(n, 1.0 / n), np.full(m, 1.0 / m)
    f_ab, g_ab, P_ab, v_ab = _dense_problem(X, Y, a, b, reg, False)
    f_aa, _, P_aa, v_aa = _dense_problem(X, X, a, a, reg, True)
    f_bb, _, _, v_bb = _dense_problem(Y, Y, b, b, reg, True)
    value = v_ab - 0.5 * (v_aa + v_bb)
    r_ab = P_ab.sum(1)
    grad_X = 2.0 * (r_ab[:, None] * X - P_ab @ Y) - 2.0 * (P_aa.sum(1)[:, None] * X - P_aa @ X)
    grad_a, grad_b = f_ab - f_aa, g_ab - f_bb
    k = (b @ grad_b - a @ grad_a) / 2.0  # the shift convention of sketchot.loss
    return {"value": value, "grad_X": grad_X, "grad_a": grad_a + k, "grad_b": grad_b - k}


def rel(x: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


def correctness(n: int, reg: float, seed: int, with_pot: bool) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    X, Y = rng.random((n, 3)), rng.random((n, 3))
    seconds, ref = timed(lambda: dense_reference(X, Y, reg))
    print(f"  dense reference n={n} reg={reg}: {seconds:.1f} s", flush=True)
    rows = []
    for label, kwargs in (
        ("exact, tol 1e-12", {"backend": "exact", "tol": 1e-12, "max_iter": 100_000}),
        ("default (auto)", {"rng": seed}),
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            seconds, res = timed(
                lambda kw=kwargs: read_grad_X(sketchot.sinkhorn_divergence(X, Y, reg=reg, **kw))
            )
        rows.append(
            {
                "n": n, "reg": reg, "method": label, "seconds": seconds,
                "backends": [r.backend for r in res.results.values()],
                "value": res.value, "value_ref": ref["value"],
                "value_abs_error": abs(res.value - ref["value"]),
                "value_error_estimate": res.value_error,
                "grad_X_rel_error": rel(res.grad_X, ref["grad_X"]),
                "grad_a_rel_error": rel(res.grad_a, ref["grad_a"]),
                "certified_marginal_error": res.accuracy,
            }
        )  # fmt: skip
        print(f"  {label}: {rows[-1]}", flush=True)
    for scaling in (0.5, 0.9):
        step = geomloss_step(X, Y, reg, scaling)
        if step is None:
            break
        seconds, value, grad = step
        rows.append(
            {
                "n": n, "reg": reg, "method": f"GeomLoss tensorized, scaling {scaling}",
                "seconds": seconds, "backends": ["dense"], "value": value,
                "value_ref": ref["value"], "value_abs_error": abs(value - ref["value"]),
                "value_error_estimate": float("nan"),
                "grad_X_rel_error": rel(grad, ref["grad_X"]),
                "grad_a_rel_error": float("nan"), "certified_marginal_error": float("nan"),
            }
        )  # fmt: skip
        print(f"  GeomLoss: {rows[-1]}", flush=True)
    if with_pot:
        seconds, value, grad = pot_step(X, Y, reg)
        rows.append(
            {
                "n": n, "reg": reg, "method": "POT solve_sample(debias=True), torch",
                "seconds": seconds, "backends": ["dense"], "value": value,
                "value_ref": ref["value"], "value_abs_error": abs(value - ref["value"]),
                "value_error_estimate": float("nan"),
                "grad_X_rel_error": rel(grad, ref["grad_X"]),
                "grad_a_rel_error": float("nan"), "certified_marginal_error": float("nan"),
            }
        )  # fmt: skip
        print(f"  POT: {rows[-1]}", flush=True)
    return rows


# --------------------------------------------------------------------------- speed
def pot_step(X, Y, reg):
    """POT's debiased divergence and its gradient (torch, dense, envelope gradient)."""
    import ot
    import torch

    x = torch.tensor(X, requires_grad=True)
    y = torch.tensor(Y)

    def run():
        res = ot.solve_sample(x, y, reg=reg, debias=True, tol=1e-6, grad="envelope")
        res.value.backward()
        return res

    seconds, res = timed(run)
    return seconds, float(res.value.detach()), x.grad.numpy().copy()


def geomloss_step(X, Y, reg, scaling, backend="tensorized"):
    """GeomLoss's divergence and gradient (torch), in sketchot's units: its cost is
    ``||x - y||^2 / 2`` at ``blur = sqrt(reg / 2)``, so ``S = 2 x`` its value. ``None``
    when geomloss (or, for ``online`` and ``multiscale``, pykeops) is not installed. The
    KeOps backends compile their formulas once per process, on a small call before the
    timed one (a training loop pays that once)."""
    try:
        import geomloss
        import torch

        if backend != "tensorized":
            import pykeops  # noqa: F401
    except ImportError:
        return None
    x = torch.tensor(X, requires_grad=True)
    y = torch.tensor(Y)
    loss = geomloss.SamplesLoss(
        "sinkhorn", p=2, blur=np.sqrt(reg / 2), scaling=scaling, backend=backend
    )
    if backend != "tensorized":
        small = torch.tensor(X[:200], requires_grad=True)
        loss(small, torch.tensor(Y[:200])).backward()

    def run():
        value = loss(x, y)
        value.backward()
        return value

    seconds, value = timed(run)
    return seconds, 2.0 * float(value.detach()), 2.0 * x.grad.numpy()


#: The reference of the speed cells' gradient errors: ``exact`` (sketchot's exact backend at
#: ``tol=1e-9``) or ``accurate`` (the default call at ``accuracy=1e-6``: a certified
#: true-kernel error of 1e-6, for sizes where the exact kernel's passes take too long).
REFERENCES = {
    "exact": {"backend": "exact", "tol": 1e-9},
    "accurate": {"accuracy": 1e-6},
}


def reference_divergence(X, Y, reg, seed, reference):
    """``(seconds, result)`` of the reference divergence, keeping only what the cells read
    (the solves' kernels, about 2 GiB each for polyts_local at n = 1e5, would stay alive
    through every step)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        seconds, exact = timed(
            lambda: read_grad_X(
                sketchot.sinkhorn_divergence(X, Y, reg=reg, rng=seed, **REFERENCES[reference])
            )
        )
    print(
        f"  {reference} reference n={len(X)} reg={reg}: {seconds:.1f} s, backends "
        f"{exact.backend}, certified {exact.accuracy:.1e}", flush=True,
    )  # fmt: skip
    return seconds, SimpleNamespace(
        grad_X=exact.grad_X, value=exact.value, accuracy=exact.accuracy,
        backends=[r.backend for r in exact.results.values()],
    )  # fmt: skip


def make_clouds(data: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The two clouds of ``n`` points: uniform in ``[0, 1]^3``, the default images' pixel
    colours (drawn with replacement), or Gaussian clouds in d = 10 (standard deviation 0.15
    per coordinate, the target's mean 0.3 along the first axis: a mean squared distance
    of about 0.54, as the unit cube's 0.5, so that the same ``reg`` means the same)."""
    if data == "uniform":
        return rng.random((n, 3)), rng.random((n, 3))
    if data == "gaussian10":
        X = 0.15 * rng.standard_normal((n, 10))
        Y = 0.15 * rng.standard_normal((n, 10))
        Y[:, 0] += 0.3
        return X, Y
    from sketchot.color import load_image, sample_pixels

    return tuple(
        sample_pixels(load_image(IMAGES / name), n, rng=rng, replace=True).colors
        for name in ("default_source.png", "default_target.png")
    )


def speed(
    n: int, reg: float, seed: int, steps: int, reference: str | None, with_pot: bool,
    peers: tuple[tuple[str, float], ...] = GEOMLOSS_PEERS, check_last: bool = True,
    cold_every: int = 1, accuracy: float | None = None, data: str = "uniform",
    cold_last: bool = True,
) -> dict[str, Any]:  # fmt: skip
    rng = np.random.default_rng(seed)
    X, Y = make_clouds(data, n, rng)
    seconds, exact = float("nan"), None
    if reference is not None:
        seconds, exact = reference_divergence(X, Y, reg, seed, reference)
    # --accuracy: the sketchot calls' accuracy= (their default, 1e-3, when not given)
    options = {} if accuracy is None else {"accuracy": accuracy}
    loss = sketchot.SinkhornDivergence(reg=reg, rng=seed, **options)
    cells: list[dict[str, Any]] = []
    Z = X.copy()
    for step in range(steps):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cpu = time.process_time()
            t_cold, cold, cpu_cold = float("nan"), None, 0.0
            if step % cold_every == 0 or (cold_last and step == steps - 1):
                t_cold, cold = timed(
                    lambda Z=Z: read_grad_X(
                        sketchot.sinkhorn_divergence(Z, Y, reg=reg, rng=seed, **options)
                    )
                )
                cpu_cold = time.process_time() - cpu
                cold = SimpleNamespace(  # released before the warm step (see the reference)
                    backends=[r.backend for r in cold.results.values()], value=cold.value,
                    iterations=[r.n_iter for r in cold.results.values()], grad_X=cold.grad_X,
                    accuracy=cold.accuracy,
                )  # fmt: skip
            else:  # --cold-every: this step's flow from scratch is not measured
                cold = SimpleNamespace(backends=[], value=None, iterations=[], grad_X=None,
                                       accuracy=None)  # fmt: skip
            before = dict(loss.last.results) if loss.last is not None else {}
            t_warm, warm = timed(lambda Z=Z: read_grad_X(loss(Z, Y)))
            cpu_warm = time.process_time() - cpu - cpu_cold
        cell = {
            "step": step, "cold_seconds": t_cold, "warm_seconds": t_warm,
            "cold_cpu_seconds": cpu_cold if cold.value is not None else float("nan"),
            "warm_cpu_seconds": cpu_warm, "cold_measured": cold.value is not None,
            "cold_backends": cold.backends,
            "warm_backends": [r.backend for r in warm.results.values()],
            "warm_used": warm.warm, "cold_value": cold.value, "warm_value": warm.value,
            "warm_iterations": [  # a kept solve (nothing moved) ran none
                0 if before.get(k) is r else r.n_iter for k, r in warm.results.items()
            ],
            "cold_iterations": cold.iterations,
            "warm_accuracy": warm.accuracy, "cold_accuracy": cold.accuracy,
        }  # fmt: skip
        if step == 0 and exact is not None:
            cell["cold_grad_rel_error"] = rel(cold.grad_X, exact.grad_X)
            cell["warm_grad_rel_error"] = rel(warm.grad_X, exact.grad_X)
            cell["exact_value"] = exact.value
        cells.append(cell)
        print(f"  step {step}: cold {t_cold:.2f} s, warm {t_warm:.2f} s", flush=True)
        last = (Z, cold.grad_X, warm.grad_X)
        Z = Z - LR * n * warm.grad_X
    at_last = None
    if reference is not None and check_last and steps > 1:
        # the warm steps' own gradient error: a reference on the last step's clouds
        Z, cold_grad, warm_grad = last
        _, at_last = reference_divergence(Z, Y, reg, seed, reference)
        cells[-1]["cold_grad_rel_error"] = rel(cold_grad, at_last.grad_X)  # always cold there
        cells[-1]["warm_grad_rel_error"] = rel(warm_grad, at_last.grad_X)
    out = {"n": n, "reg": reg, "exact_seconds": seconds, "steps": cells, "reference": reference,
           "accuracy": accuracy, "data": data}  # fmt: skip
    if exact is not None:
        out["reference_backends"] = exact.backends
        out["reference_accuracy"] = exact.accuracy
    if with_pot:
        t_pot, value, grad = pot_step(X, Y, reg)
        out["pot"] = {
            "seconds": t_pot, "value": value, "grad_rel_error": rel(grad, exact.grad_X),
            "value_abs_error": abs(value - exact.value),
        }  # fmt: skip
        print(f"  POT: {out['pot']}", flush=True)
    out["geomloss"] = []
    # the peers on the first step's clouds, and on the last step's where it has a reference
    # (the warm steps' clouds: the same gradient error measure for both)
    runs = [(0, X, exact)] + ([(steps - 1, last[0], at_last)] if at_last is not None else [])
    for at_step, clouds, ref in runs:
        for backend, scaling in peers:
            try:
                step = geomloss_step(clouds, Y, reg, scaling, backend)
            except NotImplementedError:  # KeOps' multiscale clusters on a grid in d <= 3
                print(f"  GeomLoss {backend}: not implemented in d = {X.shape[1]}", flush=True)
                continue
            if step is None:
                continue
            t_geomloss, value, grad = step
            peer = {"backend": backend, "scaling": scaling, "seconds": t_geomloss,
                    "value": value, "step": at_step}  # fmt: skip
            if ref is not None:
                peer["grad_rel_error"] = rel(grad, ref.grad_X)
                peer["value_abs_error"] = abs(value - ref.value)
            out["geomloss"].append(peer)
            print(f"  GeomLoss {backend} {scaling} at step {at_step}: {peer}", flush=True)
    return out


# -------------------------------------------------------------------------- report
def report(correct: list[dict[str, Any]], speeds: list[dict[str, Any]]) -> str:
    lines: list[str] = []
    if correct:  # --n-ref 0 leaves the correctness cells out
        lines += ["## Correctness against the dense float64 log-domain reference", ""]
        lines += md_table(
            ["n", "reg", "method", "backends", "s", "abs. value err", "value_error est.",
             "grad_X rel err", "grad_a rel err", "certified marginal err"],
            [
                [r["n"], r["reg"], r["method"], "/".join(r["backends"]), f"{r['seconds']:.2f}",
                 f"{r['value_abs_error']:.1e}", f"{r['value_error_estimate']:.1e}",
                 f"{r['grad_X_rel_error']:.1e}", f"{r['grad_a_rel_error']:.1e}",
                 f"{r['certified_marginal_error']:.1e}"]
                for r in correct
            ],
            "rrl-rrrrrr",
        )  # fmt: skip
        lines.append("")
    data = {DATA[s.get("data", "uniform")] for s in speeds}
    lines += [f"## Loss + gradient per step (s), gradient flow on {', '.join(sorted(data))}", ""]
    rows = []
    for s in speeds:
        for c in s["steps"]:
            rows.append(
                [s["n"], s["reg"], c["step"],
                 f"{c['cold_seconds']:.2f} ({c['cold_cpu_seconds']:.1f})"
                 if c.get("cold_measured", True) else "",
                 "/".join(c["cold_backends"]),
                 sum(c["cold_iterations"]) if c.get("cold_measured", True) else "",
                 f"{c['warm_seconds']:.2f} ({c['warm_cpu_seconds']:.1f})",
                 "/".join(c["warm_backends"]), sum(c["warm_iterations"]),
                 "".join("w" if used else "c" for used in c["warm_used"].values()),
                 f"{c.get('cold_grad_rel_error', float('nan')):.1e}",
                 f"{c.get('warm_grad_rel_error', float('nan')):.1e}"]
            )  # fmt: skip
        if "pot" in s:
            p = s["pot"]
            rows.append(
                [s["n"], s["reg"], 0, f"POT {p['seconds']:.2f}", "dense torch", "", "", "",
                 "", "", f"{p['grad_rel_error']:.1e}", ""]
            )  # fmt: skip
        for g in s.get("geomloss", []):
            rows.append(
                [s["n"], s["reg"], g.get("step", 0), f"GeomLoss {g['seconds']:.2f}",
                 f"{g['backend']}, scaling {g['scaling']}", "", "", "", "", "",
                 f"{g.get('grad_rel_error', float('nan')):.1e}", ""]
            )  # fmt: skip
    lines += md_table(
        ["n", "reg", "step", "cold s (cpu s)", "cold backends", "cold its", "warm s (cpu s)",
         "warm backends", "warm its", "warm used (ab/aa/bb)", "cold grad err",
         "warm grad err"],
        rows, "rrrrlrrlrlrr",
    )  # fmt: skip
    for s in speeds:
        later = s["steps"][1:]
        measured = [c for c in later if c.get("cold_measured", True)]
        if later and measured:
            # --cold-every: the flow from scratch is its measured steps' mean times the steps
            scale = len(later) / len(measured)
            estimated = " (estimated: the measured cold steps' mean x steps)" if scale > 1 else ""
            cold = scale * sum(c["cold_seconds"] for c in measured)
            warm = sum(c["warm_seconds"] for c in later)
            cpu_cold = scale * sum(c["cold_cpu_seconds"] for c in measured)
            cpu_warm = sum(c["warm_cpu_seconds"] for c in later)
            its_cold = round(scale * sum(sum(c["cold_iterations"]) for c in measured))
            its_warm = sum(sum(c["warm_iterations"]) for c in later)
            at = "" if s.get("accuracy") is None else f" accuracy={s['accuracy']:g}"
            lines.append(
                f"\nn={s['n']} reg={s['reg']}{at}: steps 1-{len(later)}: cold {cold:.1f} s (cpu "
                f"{cpu_cold:.1f} s, {its_cold} iterations){estimated}, warm {warm:.1f} s (cpu "
                f"{cpu_warm:.1f} s, {its_warm} iterations): saved {100 * (1 - warm / cold):.0f}% "
                f"of the wall time, {100 * (1 - cpu_warm / cpu_cold):.0f}% of the cpu time"
                + (
                    f"; the reference ({s.get('reference', 'exact')}: "
                    f"{'/'.join(s.get('reference_backends', ['exact']))}, certified "
                    f"{s.get('reference_accuracy', float('nan')):.1e}) took "
                    f"{s['exact_seconds']:.1f} s"
                    if np.isfinite(s["exact_seconds"])
                    else ""
                )
            )
    lines.append(
        "\nGradient errors: relative L2 error of grad_X against the reference on the same "
        "clouds (at step 0, and at the last step for the warm and cold calls there): "
        "sketchot's exact backend at tol=1e-9, or where named above its default call at "
        "accuracy=1e-6. 'its': Sinkhorn iterations of the three solves (none for a "
        "kept solve). One run per cell on a shared 2-core machine (cpu s: the process's "
        "cpu time, less sensitive to the other load)."
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a run under 2 minutes")
    parser.add_argument("--n-ref", type=int, default=None)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--regs", type=float, nargs="+", default=None)
    parser.add_argument(
        "--no-pot", action="store_true", help="leave POT and the exact reference at --n out"
    )
    parser.add_argument(
        "--no-pot-speed", action="store_true", help="keep the exact reference, leave POT at --n out"
    )
    parser.add_argument(
        "--reference", choices=sorted(REFERENCES), default="exact",
        help="the speed cells' gradient reference (exact: tol 1e-9; accurate: accuracy 1e-6)",
    )  # fmt: skip
    parser.add_argument(
        "--peers", nargs="*", default=None, metavar="BACKEND:SCALING",
        help="GeomLoss peers at --n (default: online and multiscale at 0.5 and 0.9)",
    )  # fmt: skip
    parser.add_argument(
        "--accuracy", type=float, default=None,
        help="accuracy= of sketchot's flow calls (default: the library's, 1e-3)",
    )  # fmt: skip
    parser.add_argument(
        "--cold-every", type=int, default=1, metavar="K",
        help="the flow from scratch at every K-th step only (and the last; a long flow)",
    )  # fmt: skip
    parser.add_argument(
        "--no-cold-last", action="store_true",
        help="no flow from scratch at the last step either (a size where one is slow)",
    )  # fmt: skip
    parser.add_argument(
        "--no-check-last", action="store_true",
        help="no second reference on the last step's clouds (the warm steps' gradient error)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--data", choices=sorted(DATA), default="uniform", help="the speed cells' clouds"
    )
    parser.add_argument(
        "--out", default=None, help="file stem under benchmarks/results (default loss[_quick])"
    )
    args = parser.parse_args(argv)
    n_ref = args.n_ref if args.n_ref is not None else (1000 if args.quick else 2000)
    steps = args.steps or (3 if args.quick else 5)
    regs = args.regs or ([0.1] if args.quick else [0.1, 0.01])
    stem = args.out or ("loss_quick" if args.quick else "loss")
    start = time.perf_counter()
    correct, speeds = [], []
    peers = GEOMLOSS_PEERS
    if args.peers is not None:
        peers = tuple(
            (name, float(scaling)) for name, scaling in (p.split(":") for p in args.peers)
        )
    for reg in regs if n_ref > 0 else []:  # --n-ref 0: no correctness cells
        print(f"correctness, reg={reg}", flush=True)
        correct += correctness(n_ref, reg, args.seed, not args.no_pot)
    for reg in regs:
        print(f"speed, reg={reg}", flush=True)
        reference = None if (args.quick or args.no_pot) else args.reference
        with_pot = reference == "exact" and not args.no_pot_speed
        check_last = not args.no_check_last
        speeds.append(
            speed(args.n, reg, args.seed, steps, reference, with_pot, peers, check_last,
                  args.cold_every, args.accuracy, args.data, not args.no_cold_last)
        )  # fmt: skip
    text = report(correct, speeds)
    print(text)
    data = {
        "correctness": correct, "speed": speeds, "argv": sys.argv[1:],
        "seconds": time.perf_counter() - start, "machine": platform.platform(),
        "cpus": os.cpu_count(), "sketchot": sketchot.__version__,
    }  # fmt: skip
    write_json(RESULTS_DIR / f"{stem}.json", data)
    write_text(RESULTS_DIR / f"{stem}.md", text)


if __name__ == "__main__":
    main()
