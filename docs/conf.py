"""Sphinx configuration of the sketchot documentation.

Build (from the repository root)::

    pip install ".[docs]"
    sphinx-build -W -b html docs docs/_build/html

Nothing here reaches the network: no intersphinx, the theme's assets are packaged, and the
gallery's examples run on the images committed in ``images/``.
"""

import importlib.util
import os
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # document the sketchot of this checkout
sys.path.insert(0, str(ROOT / "docs"))

from _results_tables import write_figure, write_tables  # noqa: E402

import sketchot  # noqa: E402
import sketchot.policy.describe  # noqa: E402

# the benchmark pages include the committed outputs' tables and a figure drawn from their
# JSON, converted here (no measurement at build time)
write_tables(ROOT / "benchmarks" / "results", ROOT / "docs" / "benchmarks" / "generated")
write_figure(ROOT / "benchmarks" / "results", ROOT / "docs" / "benchmarks" / "generated")
# the ladder of backend="auto" is written from the code (sketchot.policy.describe), never
# by hand: the user guide includes it and its substitutions (|local_rtol|)
LADDER = ROOT / "docs" / "user_guide" / "generated" / "auto_ladder.rst"
LADDER.parent.mkdir(exist_ok=True)
LADDER.write_text(sketchot.policy.describe.ladder_rst())
rst_prolog = sketchot.policy.describe.rst_substitutions()

project = "sketchot"
author = "sketchot developers"
copyright = "sketchot developers"
version = release = sketchot.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "numpydoc",
    "sphinx_gallery.gen_gallery",
]

exclude_patterns = [
    "_build",
    "**.ipynb_checkpoints",
    "benchmarks/generated",
    "user_guide/generated",
]
templates_path = ["_templates"]
source_suffix = {".rst": "restructuredtext"}
root_doc = "index"

# --- API reference -----------------------------------------------------------------------
autosummary_generate = True
autosummary_imported_members = False
autodoc_default_options = {"members": False}
autodoc_typehints = "none"  # the numpydoc sections carry the types
numpydoc_show_class_members = False  # the class template lists the members itself
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
numpydoc_validation_checks: set[str] = set()

# --- gallery -----------------------------------------------------------------------------
sphinx_gallery_conf = {
    "examples_dirs": [str(ROOT / "examples")],
    "gallery_dirs": ["auto_examples"],
    # Every examples/plot_*.py is executed; the command-line programs next to them
    # (color_transfer.py, compare_backends.py) are not gallery items at all.
    "filename_pattern": r"[\\/]plot_",
    "ignore_pattern": r"(^|[\\/])(?!plot_)[^\\/]*\.py$",
    "within_subsection_order": "FileNameSortKey",
    "download_all_examples": False,
    "remove_config_comments": True,
    "plot_gallery": "True",
    "abort_on_example_error": True,
    "matplotlib_animations": False,
    "image_scrapers": ("matplotlib",),
    "show_memory": False,
    "min_reported_time": 1,
}

# matplotlib without a display; the examples' own warnings are printed, not fatal, but
# Sphinx's -W stays on for the documentation itself.
os.environ.setdefault("MPLBACKEND", "Agg")
warnings.filterwarnings("ignore", message="Matplotlib is currently using agg")

# Without PyTorch (the ``torch`` extra) the site still builds: autodoc sees a stand-in torch
# and the gallery skips the examples that train with it. CI installs torch and builds all.
HAVE_TORCH = importlib.util.find_spec("torch") is not None


def _import_all_but_torch_modules() -> None:
    """Import, with the real (absent) torch, every module of sketchot that does not need it,
    and so POT and SciPy. Imported later, under autodoc's stand-in torch, they would take the
    stand-in for PyTorch: POT would register a torch backend, and SciPy's bundled
    array_api_compat calls ``issubclass(cls, torch.Tensor)``, which the stand-in fails."""
    import pkgutil

    for module in pkgutil.walk_packages(sketchot.__path__, "sketchot."):
        try:
            importlib.import_module(module.name)
        except ImportError as exc:  # the torch and Triton modules (the torch extra)
            if (exc.name or "").split(".")[0] not in ("torch", "triton"):
                raise


if not HAVE_TORCH:
    _import_all_but_torch_modules()
    autodoc_mock_imports = ["torch"]
    sphinx_gallery_conf["ignore_pattern"] += r"|plot_fit_torch_model\.py$"
    # its page from an earlier build with torch, if any, is in no toctree now
    exclude_patterns.append("auto_examples/plot_fit_torch_model.rst")

# --- HTML ----------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"sketchot {release}"
html_static_path = ["_static"]
html_css_files = ["sketchot.css"]
html_theme_options = {
    "navbar_end": ["navbar-icon-links"],
    "secondary_sidebar_items": ["page-toc"],
    "show_toc_level": 2,
    "navigation_with_keys": False,
}
html_show_sourcelink = False
html_copy_source = False
