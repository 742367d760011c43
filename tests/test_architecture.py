"""The layout shows the architecture: imports only point down, no import circle, no private
name across packages, the solver knows kernels only through the operator contract (no
backend module, no private attribute, no Dask), the choice of ``'auto'`` lives in
:mod:`sketchot.policy` (above the solver, below the jobs, passed down by its callers), and
Dask inputs part from in-memory ones in one place, :mod:`sketchot.api`. The jobs reach the
layers below through the packages' namespaces only (``sketchot.solver``, never
``sketchot.solver.sinkhorn``), never import one another sideways, touch no other object's
private attribute, and name no backend.

Every import counts, module level or inside a function, except those under
``if TYPE_CHECKING:`` (never executed: annotations only).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sketchot"

#: Layer of each part of the package, bottom up.
LAYERS = {
    "_validation": 0, "_memory": 0, "_dask": 0, "_defaults": 0, "_arrays": 0, "_autograd": 0,
    "_parallel": 1,
    "gibbs": 1, "cost_matrix": 1, "sparse_cost": 1, "grid": 1, "fused": 1, "sketch": 1,
    "distributed.geometry": 1, "kernels": 2, "distributed.kernels": 2,
    "distributed.builders": 2, "distributed.local": 2, "solver": 3, "distributed.solver": 3,
    "distributed": 3,
    "policy": 4, "da": 5, "api": 6, "matrix": 6,
    "barycenter": 7, "batch": 7, "color": 7, "convolutional": 7, "loss": 7, "nn": 8,
}  # fmt: skip
BACKEND_MODULES = {"exact", "rff", "nystrom", "polyts", "local"}
SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE)
ALL_SOURCES = sorted(PACKAGE.rglob("*.py"))


def layer(parts: list[str]) -> int:
    """Layer of a module given as path components (``distributed`` is split by module)."""
    name = ".".join(parts[:2]).removesuffix(".py")
    return LAYERS.get(name, LAYERS[parts[0].removesuffix(".py")])


def part_of(path: Path) -> list[str]:
    return list(path.relative_to(PACKAGE).parts)


def module_name(path: Path) -> str:
    """Dotted name below the package (``''`` for ``sketchot/__init__.py``)."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.AST) -> set[int]:
    """Ids of the nodes under ``if TYPE_CHECKING:``."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skipped |= {id(inner) for inner in ast.walk(child)}
    return skipped


def imports(path: Path) -> list[tuple[list[str], list[str]]]:
    """``(module, names)`` of every executed import of sketchot modules: the module as path
    components below the package, the imported names."""
    here = list(path.relative_to(PACKAGE).parent.parts)
    tree = ast.parse(path.read_text())
    skipped = _type_checking_only(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped or not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        names = [alias.name for alias in node.names]
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                found.append((base + (node.module.split(".") if node.module else []), names))
            elif node.module and node.module.startswith("sketchot"):
                found.append((node.module.split(".")[1:], names))
        elif isinstance(node, ast.Import):
            found += [(n.split(".")[1:], []) for n in names if n.startswith("sketchot.")]
    return found


def imported_modules(path: Path) -> list[list[str]]:
    """Imported sketchot modules as path components below the package."""
    return [parts for parts, _ in imports(path) if parts]


MODULES = {module_name(path): path for path in ALL_SOURCES}


def import_graph() -> dict[str, set[str]]:
    """Module -> the sketchot modules it imports (``from pkg import sub`` is an import of the
    submodule ``pkg.sub``)."""
    graph = {}
    for name, path in MODULES.items():
        targets = set()
        for parts, names in imports(path):
            module = ".".join(parts)
            for imported in names or [""]:
                sub = f"{module}.{imported}".strip(".")
                targets.add(sub if sub in MODULES else module)
        graph[name] = {t for t in targets if t in MODULES and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path):
    own = layer(part_of(path))
    for parts in imported_modules(path):
        assert layer(parts) <= own, f"{path.name} imports {'.'.join(parts)} (a layer up)"


def test_no_import_circle():
    assert circles(import_graph()) == []


def test_the_checks_see_imports_inside_functions():
    """The checkers themselves: a function-level import is an edge (``api`` imports
    ``distributed`` only when given Dask arrays), and a loop of edges is a circle."""
    assert "distributed" in import_graph()["api"]
    graph = {"a": {"b"}, "b": set()}
    assert circles(graph) == []
    graph["b"].add("a")
    assert circles(graph) == [["a", "b"]]


def test_no_private_name_imported_across_packages():
    for name, path in MODULES.items():
        own = name.split(".")[0]
        for parts, names in imports(path):
            theirs = parts[0] if parts else ""
            if theirs == own or theirs.startswith("_"):
                continue
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            assert not private, f"{name} imports {private} from {'.'.join(parts)}"


def test_solver_imports_no_backend_module_no_dask_and_no_private_attribute():
    for path in sorted((PACKAGE / "solver").glob("*.py")):
        for parts in imported_modules(path):
            assert not (parts[0] == "kernels" and parts[-1] in BACKEND_MODULES), path.name
            assert parts[0] not in ("distributed", "_dask", "api"), path.name
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
                owner = node.value.id if isinstance(node.value, ast.Name) else ""
                assert node.attr.startswith("__") or owner in ("self", "cls"), (
                    f"{path.name}: private attribute .{node.attr}"
                )


def test_dask_inputs_part_in_one_place():
    """Only :mod:`sketchot.api` tells Dask inputs apart (``_dask``) and sends them to
    :mod:`sketchot.distributed`; no other module asks whether a geometry is distributed."""
    for name, path in MODULES.items():
        if name.split(".")[0] in ("api", "distributed", "_dask"):
            continue
        for parts in imported_modules(path):
            assert parts[0] not in ("distributed", "_dask"), f"{name} imports {parts}"
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            attribute = isinstance(node, ast.Attribute) and node.attr == "distributed"
            lookup = isinstance(node, ast.Constant) and node.value == "distributed"
            assert not (attribute or lookup), f"{name} asks for 'distributed'"


def _backend_literals(path: Path, names: set[str]) -> list[str]:
    """Where a string literal naming a backend selects or tests one in ``path``: an argument
    of a call (directly, or inside a literal container that is one), a comparison with an
    expression that mentions ``backend``, or the value of a name that mentions ``backend``.
    Docstrings and other uses of the same words (the ``'exact'`` capability and safeguard
    policy) are not selections."""
    tree = ast.parse(path.read_text())
    parent = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and node.value in names):
            continue
        holder = parent.get(id(node))
        while isinstance(holder, ast.Tuple | ast.List | ast.Set | ast.Dict):
            holder = parent.get(id(holder))
        if isinstance(holder, ast.keyword):
            holder = parent.get(id(holder))
        selects = isinstance(holder, ast.Call) or (
            isinstance(holder, ast.Compare | ast.Assign | ast.AnnAssign)
            and "backend" in ast.unparse(holder).lower()
        )
        if selects:
            found.append((node.lineno, f"{path.name}:{node.lineno}: {node.value!r}"))
    return [hit for _, hit in sorted(found)]


def test_the_solver_and_the_auto_strategy_name_no_backend():
    """``'auto'`` reads the policy table (:mod:`sketchot.policy.table`, the one place that
    names the backends it tries) and the records; the solver and the strategy never pick a
    backend by name."""
    import sketchot

    names = set(sketchot.available_backends())
    strategy = ["ladder.py", "solve.py", "describe.py", "__init__.py"]
    paths = [
        *sorted((PACKAGE / "solver").glob("*.py")),
        *(PACKAGE / "policy" / name for name in strategy),
        PACKAGE / "kernels" / "judge.py",
    ]
    assert [hit for path in paths for hit in _backend_literals(path, names)] == []


def test_the_backend_literal_check_sees_a_selection(tmp_path):
    source = tmp_path / "example.py"
    source.write_text(
        'build_kernel(geometry, "nystrom")\n'
        'Attempt("polyts", {"variant": "local"})\n'
        'if kernel.info.backend == "exact": pass\n'
        'LOW_RANK_BACKEND = "nystrom"\n'
        'if "exact" in kernel.info.capabilities: pass\n'
        'POLICIES = ("exact", "clip")\n'
    )
    hits = _backend_literals(source, {"exact", "nystrom", "polyts"})
    assert [hit.split(":")[1] for hit in hits] == ["1", "2", "3", "4"]


def test_the_policy_is_one_package_above_the_solver_below_the_jobs():
    """Only :mod:`sketchot.policy` chooses: no other module defines the ladder's entry points,
    no module below it imports it (the kernels and the solver get it as ``policy=`` from
    their callers), nothing installs it at import time, and the policy imports no job."""
    graph = import_graph()
    assert LAYERS["solver"] < LAYERS["policy"] < min(LAYERS[j] for j in ("barycenter", "loss"))
    below = [n for n in graph if n.split(".")[0] in ("kernels", "solver", "gibbs", "sketch")]
    assert not [n for n in below if any(t.startswith("policy") for t in graph[n])]
    assert not (PACKAGE / "_auto.py").exists()
    jobs = ("api", "barycenter", "batch", "loss", "nn", "da", "color")
    for name, targets in graph.items():
        if name.startswith("policy"):
            assert not [t for t in targets if t.split(".")[0] in jobs], name
    defining = {
        name
        for name, path in MODULES.items()
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.FunctionDef) and node.name in ("choose", "solve_auto")
    }
    assert defining == {"policy.ladder", "policy.solve"}


#: The jobs: the public entries (:mod:`sketchot.api`, :mod:`sketchot.matrix`) and what is
#: built on the solver and the policy (the estimator, colour transfer, the divergence,
#: barycentres, batches, the PyTorch face), with the Dask placement of the solve.
JOBS = ("api", "matrix", "barycenter", "batch", "convolutional", "loss", "nn", "da", "color",
        "distributed.solver")  # fmt: skip
#: The packages a job reaches through their namespace only.
ENTRY_PACKAGES = ("solver", "policy", "kernels")
#: The job-to-job imports there are: the divergence is built on the public solves, the
#: PyTorch face on the divergence, and colour transfer sends a Dask image through the public
#: entries' Dask dispatch. Any other job importing a job is sideways.
JOB_ON_JOB = {("loss", "api"), ("nn", "loss"), ("color", "api")}


def job_of(name: str) -> str | None:
    """The job a module (dotted name below the package) belongs to, or ``None``."""
    return next((j for j in JOBS if name == j or name.startswith(j + ".")), None)


def entry_violations(path: Path) -> list[str]:
    """Imports in ``path`` of a submodule of :data:`ENTRY_PACKAGES` (``sketchot.solver.plans``)
    or of a name the package does not export (its ``__all__``): an import of a package's
    namespace is ``from sketchot.solver import name`` or ``from sketchot import solver``."""
    import importlib

    found = []
    for parts, names in imports(path):
        if not parts or parts[0] not in ENTRY_PACKAGES:
            continue
        if len(parts) > 1:
            found.append(f"{path.name} imports {'.'.join(parts)}")
            continue
        exported = importlib.import_module(f"sketchot.{parts[0]}").__all__
        found += [f"{path.name} imports {parts[0]}.{n}" for n in names if n not in exported]
    return found


def test_jobs_import_the_solver_policy_and_kernels_packages_not_their_submodules():
    """The solver's entry is its package's namespace (validate, solve, certify: see
    :mod:`sketchot.solver`); the jobs never reach into its modules, nor the policy's or the
    kernels'."""
    found = [v for name, path in MODULES.items() if job_of(name) for v in entry_violations(path)]
    assert found == []


def test_the_entry_check_sees_a_deep_import(tmp_path, monkeypatch):
    example = tmp_path / "sketchot" / "loss.py"
    example.parent.mkdir()
    example.write_text(
        "from .solver.plans import value_error_estimate\n"
        "from .solver import solve, not_exported\n"
        "from . import policy\n"
        "import sketchot.kernels.registry\n"
    )
    monkeypatch.setitem(globals(), "PACKAGE", example.parent)
    assert entry_violations(example) == [
        "loss.py imports solver.plans",
        "loss.py imports solver.not_exported",
        "loss.py imports kernels.registry",
    ]


def test_no_sideways_import_between_jobs():
    """A job imports another job only along :data:`JOB_ON_JOB`: barycentres, batches, the
    estimator and colour transfer stand side by side on the solver and the policy."""
    graph = import_graph()
    edges = {
        (job_of(name), job_of(target))
        for name, targets in graph.items()
        for target in targets
        if job_of(name) and job_of(target) and job_of(name) != job_of(target)
    }
    assert edges <= JOB_ON_JOB, edges - JOB_ON_JOB


#: Underscore attributes that are public APIs of the standard library, not private state.
PUBLIC_UNDERSCORE = {
    "_exit": "os._exit, leaving a forked child without running the parent's handlers",
    "_replace": "namedtuple._replace",
    "_asdict": "namedtuple._asdict",
    "_fields": "namedtuple._fields",
    "_getframe": "sys._getframe, the documented frame access (inspect.stack reads every file)",
}


def private_names_defined(tree: ast.AST) -> set[str]:
    """The single-underscore names a module defines: its functions, methods and classes, the
    names and attributes it assigns, its ``__slots__``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Assign) and "__slots__" in map(ast.unparse, node.targets):
            names |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
    return {n for n in names if isinstance(n, str) and n.startswith("_") and n[1:2] != "_"}


def private_attributes(path: Path, *, module_private: bool = False) -> list[str]:
    """``obj._name`` in ``path`` on anything but ``self`` or ``cls`` (another object's private
    state), less :data:`PUBLIC_UNDERSCORE`; with ``module_private``, less the names the module
    defines itself (:func:`private_names_defined`: a leading underscore is private to its
    module, as PEP 8 reads it)."""
    tree = ast.parse(path.read_text())
    own = private_names_defined(tree) if module_private else set()
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")):
            continue
        owner = node.value.id if isinstance(node.value, ast.Name) else ""
        if node.attr.startswith("__") or owner in ("self", "cls"):
            continue
        if node.attr not in PUBLIC_UNDERSCORE and node.attr not in own:
            found.append(node)
    found.sort(key=lambda node: (node.lineno, node.col_offset))
    return [f"{path.name}:{node.lineno}: {ast.unparse(node)}" for node in found]


def test_the_jobs_and_the_solver_touch_no_private_attribute():
    """Jobs and solvers (in memory and on Dask) use other objects through their public
    attributes and methods only."""
    paths = [path for name, path in MODULES.items() if job_of(name) or name.startswith("solver")]
    assert [hit for path in paths for hit in private_attributes(path)] == []


def test_no_module_outside_the_kernels_touches_another_modules_private_attribute():
    """Outside ``kernels/`` (whose operators, placements and sketches share their private
    contract), a module reads only the private attributes it defines itself: the geometry,
    the sketch core, the array layer and Dask's pieces use one another through public
    names."""
    hits = [
        hit
        for name, path in MODULES.items()
        if name.split(".")[0] != "kernels"
        for hit in private_attributes(path, module_private=True)
    ]
    assert hits == []


def test_the_private_attribute_check_sees_one(tmp_path):
    source = tmp_path / "example.py"
    source.write_text(
        "self._a\ncls._b\nkernel._c\nself.kernel._d\nrow._replace(x=1)\nother._e\n"
        "class Own:\n    __slots__ = ('_f',)\n    def _g(self): return None\n"
        "view._f\nview._g()\nthing._h = 1\nthing._h\n"
    )
    assert [hit.split(": ")[1] for hit in private_attributes(source)] == [
        "kernel._c", "self.kernel._d", "other._e", "view._f", "view._g", "thing._h",
        "thing._h",
    ]  # fmt: skip
    assert [hit.split(": ")[1] for hit in private_attributes(source, module_private=True)] == [
        "kernel._c", "self.kernel._d", "other._e",
    ]  # fmt: skip


#: Modules outside ``kernels/`` and ``policy/`` that may name a backend, and why.
NAMING_BACKENDS: dict[str, str] = {}


def test_no_backend_named_outside_the_kernels_and_the_policy():
    """Only the kernels (each registers its own name) and the policy's table (which names the
    backends ``'auto'`` tries) select a backend by its name; the jobs, the solver and the
    public entries take names from their callers or from :mod:`sketchot.kernels`
    (``EXACT_BACKEND``). Docstrings, messages and the safeguard's ``'exact'`` policy are not
    selections (:func:`_backend_literals`)."""
    import sketchot

    names = set(sketchot.available_backends())
    hits = [
        f"{name}: {hit}"
        for name, path in MODULES.items()
        if name.split(".")[0] not in ("kernels", "policy") and name not in NAMING_BACKENDS
        for hit in _backend_literals(path, names)
    ]
    assert hits == []


#: The engine (issue 43's split): strategies x a stopper x drivers, and the entry.
ENGINE = ["engine", "strategies", "stopping", "drivers"]
#: The largest McCabe complexity a function of the engine may have.
ENGINE_MAX_COMPLEXITY = 15


def _complexity_report(paths: list[Path], limit: int) -> subprocess.CompletedProcess:
    """ruff's McCabe check (``C901``) of ``paths`` above ``limit``."""
    return subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "C901",
         "--config", f"lint.mccabe.max-complexity={limit}", "--output-format", "concise",
         *map(str, paths)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_no_function_of_the_engine_is_above_the_complexity_limit():
    """The iteration stays readable: no engine function above McCabe complexity
    :data:`ENGINE_MAX_COMPLEXITY` (the loop before the split, at f8234c0, was 25)."""
    pytest.importorskip("ruff")
    report = _complexity_report(
        [PACKAGE / "solver" / f"{m}.py" for m in ENGINE], ENGINE_MAX_COMPLEXITY
    )
    assert report.returncode == 0, report.stdout


def test_the_complexity_check_sees_a_complex_function(tmp_path):
    pytest.importorskip("ruff")
    branches = "".join(
        f"    if x == {i}:\n        return {i}\n" for i in range(ENGINE_MAX_COMPLEXITY)
    )
    source = tmp_path / "example.py"
    source.write_text(f"def f(x):\n{branches}    return -1\n")
    report = _complexity_report([source], ENGINE_MAX_COMPLEXITY)
    assert report.returncode == 1 and "`f` is too complex (16 > 15)" in report.stdout
