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


def write_tables(results: Path, target: Path) -> None:
    """Write ``target/NAME.rst`` for every name of :data:`INCLUDED`."""
    target.mkdir(parents=True, exist_ok=True)
    for name in INCLUDED:
        text = md_to_rst((results / f"{name}.md").read_text())
        path = target / f"{name}.rst"
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
