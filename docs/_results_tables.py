"""The benchmark pages' tables, generated at build time from the committed outputs.

``benchmarks/results/NAME.md`` (what a script printed) becomes
``docs/benchmarks/generated/NAME.rst`` (git ignores it), which a page includes: a number
in the site is the number the script printed, with no copy to fall out of date.
"""

from __future__ import annotations

import re
from pathlib import Path

#: The outputs included by the benchmark pages.
INCLUDED = (
    "sinkhorn_speed_quick",
    "small_reg_quick",
    "small_reg_coarse",
    "small_reg_coarse_1e6",
    "small_reg_truncate",
    "small_reg_tau",
    "small_reg_jensen",
    "small_reg_certify",
    "small_reg_certify_1e6",
    "local_kernel_truncate",
    "dask_scale_quick",
    "polyts_improved_quick",
    "unbalanced_quick",
    "gpu_cpu_tensors",
    "gpu_cpu_tensors_before",
    "gpu_cpu_tensors_1e6",
    "gpu_cpu_tensors_reg0.01_recheck",
    "gpu_local_cpu",
    "gpu_local_cpu_before",
    "gpu_quick",
    "float32",
    "gpu_1e5",
    "gpu_h100",
    "gpu_h100_first_kernel",
    "gpu_h100_d64",
    "batch",
    "batch_small",
    "batch_small_0.10.0",
    "barycenter_quick",
    "barycenter_1e4_pot",
    "barycenter_large",
    "loss_reg0.01",
    "loss_reg0.01_acc3e-4",
    "loss_1e5",
    "loss_1e5_acc1e-2",
    "loss_colours_1e6",
    "loss_uniform_1e6",
    "loss_gaussian10",
    "loss_colours_1e4",
    "loss_colours_1e5",
    "loss_reg0.1",
    "loss_flow50_1e5",
    "loss_flow50",
    "accuracy_quick",
    "accuracy_2e4_auto",
    "accuracy_2e4_certify",
    "sparse_cost",
    "dask_certified",
    "dask_certified_plain",
    "dask_certified_reg0.001",
    "dask_local_1e5",
    "dask_local_1e5_dask_malloc",
    "dask_local_1e6",
    "dask_local_blocks",
    "dask_local_1e7_colours",
    "dask_local_workers1",
    "dask_local_workers2",
    "dask_local_workers4",
    "dask_images",
)


def _inline(text: str) -> str:
    """Markdown inline code to reStructuredText literals."""
    return re.sub(r"(?<!`)`([^`]+)`(?!`)", r"``\1``", text)


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def md_to_rst(markdown: str) -> str:
    """Tables as ``list-table`` directives, bullets and paragraphs as they are, headings
    dropped (the page has its own)."""
    out: list[str] = []
    table: list[list[str]] = []

    def flush() -> None:
        if not table:
            return
        out.extend(["", ".. list-table::", "   :header-rows: 1", "   :class: sk-numbers", ""])
        for row in table:
            for k, cell in enumerate(row):
                out.append(f"   {'* -' if k == 0 else '  -'} {_inline(cell)}".rstrip())
        out.append("")
        table.clear()

    for line in markdown.splitlines():
        if line.startswith("|"):
            if not re.fullmatch(r"\|[\s:|-]+\|?", line.strip()):
                table.append(_cells(line))
            continue
        flush()
        if line.startswith("#"):
            continue
        out.append(_inline(line))
    flush()
    return "\n".join(out).strip() + "\n"


def committed_paths(markdown: str, name: str) -> str:
    """The command that printed an output, with the scratch paths it was first written to
    (``--json /tmp/ab/speed_new_3.json``) replaced by the committed files' paths: the
    command a reader runs to reproduce ``benchmarks/results/NAME.*``."""
    for option, suffix in (("--json", "json"), ("--out-md", "md")):
        markdown = re.sub(
            rf"{option} /tmp/\S+?\.{suffix}\b", f"{option} benchmarks/results/{name}.{suffix}",
            markdown,
        )  # fmt: skip
    return markdown


def write_tables(results: Path, target: Path) -> None:
    """Write ``target/NAME.rst`` for every name of :data:`INCLUDED`."""
    target.mkdir(parents=True, exist_ok=True)
    for name in INCLUDED:
        text = md_to_rst(committed_paths((results / f"{name}.md").read_text(), name))
        if "/tmp/" in text:
            raise ValueError(f"benchmarks/results/{name}.md names a scratch path under /tmp/")
        path = target / f"{name}.rst"
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


#: The figure of the benchmark pages: (committed output, the command that printed it).
FIGURE_SOURCES = {
    "accuracy_quick": "python benchmarks/accuracy.py --quick --budget 60 "
    "--json benchmarks/results/accuracy_quick.json",
    "loss_reg0.01": "python benchmarks/loss.py --regs 0.01 --steps 5 --no-pot-speed "
    "--out loss_reg0.01",
}

#: One colour and marker per method across both panels (sketchot's in blues, POT's and
#: GeomLoss's in their own hues).
_STYLE = {
    "auto": ("tab:blue", "o"),
    "default (auto)": ("tab:blue", "o"),
    "exact": ("tab:cyan", "s"),
    "exact, tol 1e-12": ("tab:cyan", "s"),
    "nystrom": ("tab:purple", "^"),
    "rff": ("tab:pink", "v"),
    "polyts": ("tab:olive", "D"),
    "POT dense": ("tab:red", "P"),
    "POT Nystroem 1000": ("tab:orange", "X"),
    "POT solve_sample(debias=True), torch": ("tab:red", "P"),
    "GeomLoss tensorized, scaling 0.5": ("tab:green", "<"),
    "GeomLoss tensorized, scaling 0.9": ("darkgreen", ">"),
}


def _plot_methods(ax, points: dict[str, list[tuple[float, float]]], ceiling: float) -> None:
    """Time (y) against error (x) per method; an error above ``ceiling / 10`` or not finite
    (a refused or failed result) is drawn at ``ceiling`` with a hollow marker, one below
    1e-16 (float64 rounding) at 1e-16."""
    for method, cells in points.items():
        colour, marker = _STYLE.get(method, ("grey", "."))
        finite = [(max(e, 1e-16), t) for e, t in cells if e == e and e <= ceiling / 10]
        failed = [t for e, t in cells if not (e == e and e <= ceiling / 10)]
        if finite:
            ax.scatter(*zip(*finite, strict=True), color=colour, marker=marker, label=method,
                       s=36, alpha=0.85)  # fmt: skip
        if failed:
            ax.scatter([ceiling] * len(failed), failed, facecolors="none", edgecolors=colour,
                       marker=marker, s=36, label=None if finite else method)  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.grid(True, which="major", alpha=0.3)


def write_figure(results: Path, target: Path) -> Path:
    """Draw ``target/time_vs_error.png`` from the committed JSON of :data:`FIGURE_SOURCES`
    (no measurement here): the solves of ``accuracy_quick`` (time against the certified
    true-kernel marginal error) and the divergences of ``loss_reg0.01`` (time against the
    value's error, sketchot beside POT and GeomLoss)."""
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    target.mkdir(parents=True, exist_ok=True)
    accuracy = json.loads((results / "accuracy_quick.json").read_text())["rows"]
    loss = json.loads((results / "loss_reg0.01.json").read_text())["correctness"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.6), constrained_layout=True)

    solves: dict[str, list[tuple[float, float]]] = {}
    for row in accuracy:
        solves.setdefault(row["backend"], []).append((row["error_bound"], row["seconds"]))
    ceiling = 10.0  # a relative L1 marginal error of 1 or more: no transport plan at all
    _plot_methods(left, solves, ceiling)
    left.set_xlim(3e-17, 3 * ceiling)
    left.axvline(1e-3, color="black", linestyle="--", linewidth=1)
    left.text(1e-3, left.get_ylim()[1], " accuracy = 1e-3", va="top", fontsize=8)
    left.text(ceiling, left.get_ylim()[0], "refused, or\nerror > 1 ", ha="right",
              va="bottom", fontsize=8)  # fmt: skip
    left.set_xlabel("certified true-kernel error (relative L1 marginal error)")
    left.set_ylabel("time (s): build, solve and check")
    left.set_title("Sinkhorn solves, n = 2000: 3 data sets x reg / mean sq. distance 1, 0.1, "
                   "0.01", fontsize=9)  # fmt: skip
    left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=4)

    losses: dict[str, list[tuple[float, float]]] = {}
    for row in loss:
        losses.setdefault(row["method"], []).append((row["value_abs_error"], row["seconds"]))
    _plot_methods(right, losses, ceiling=10.0)
    right.set_xlabel("|divergence - dense float64 log-domain reference|")
    right.set_ylabel("time (s): value and gradient")
    n, reg = loss[0]["n"], loss[0]["reg"]
    right.set_title(f"Sinkhorn divergence, n = {n}, reg = {reg:g} (uniform points in "
                    "[0, 1]^3)", fontsize=9)  # fmt: skip
    right.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)

    path = target / "time_vs_error.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
