"""The paper's plain protocol as a driver of the one iteration (``order='paper'``).

Han, Avron and Shin (2020, Algorithm 1 and Figure 2) run Sinkhorn's iteration literally: from
``v = 1``, ``u = a / (K v)`` first, then ``v = b / (K^T u)``, a fixed number of iterations and
no convergence check. :func:`~sketchot.solver.plain.plain_sinkhorn` (the paper benchmark's
iteration, ``benchmarks/paper_sinkhorn.py``) reaches it through
:func:`~sketchot.solver.engine.iterate` with ``order='paper'``; it runs the same strategies'
half-steps as the solver but none of its checks, stall rule, mixing or repairs between
iterations, so that the solver's loop carries no benchmark mode.
"""

from __future__ import annotations

import time

import numpy as np

from .drivers import Iterate, Run


class PaperRun(Run):
    """``max_iter`` iterations in the paper's order, each timed when asked; the status is
    ``'fixed'`` and the history empty (``tol`` and ``check_every`` are not read)."""

    def cold_log_v(self) -> np.ndarray:
        """The paper's ``v = 1`` (every entry, zero weights included)."""
        return np.zeros_like(self.strategy.log_weights["cols"])

    def run(self, tol, max_iter, check_every, timed, offset=0) -> Iterate:
        st = self.strategy
        u, v = st.enter(*self.initial_logs(), exact_first=self.problem.log_v0 is None)
        projection = st.project("cols", v)
        times: list[float] = []
        n_iter = 0
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            for iteration in range(1, max_iter + 1):
                begin = time.perf_counter()
                u, proj_first, _ = st.half_step("rows", projection, v)
                v, projection, _ = st.half_step("cols", proj_first, u)
                n_iter = iteration
                if timed:
                    times.append(time.perf_counter() - begin)
        st.finish()
        log_u, log_v = st.log_scalings(u, v)
        return self.result(log_u, log_v, n_iter, "fixed", [], times if timed else None, (u, v))
