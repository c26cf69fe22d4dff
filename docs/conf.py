"""Sphinx configuration of mpisphere's documentation site.

Build it with ``pip install '.[docs]'`` and ``sphinx-build -W docs docs/_build/html``
(warnings are errors, as in CI). Pages are Markdown (MyST) except the API
reference, which autosummary generates from the docstrings (numpydoc).
"""

import importlib.util
import os
import sys

import mpi4py

# The build imports every module but never communicates: no MPI_Init (and no MPI runtime needed at all;
# where mpi4py finds no MPI library, it is mocked like the optional extras below).
mpi4py.rc.initialize = False
mpi4py.rc.finalize = False
try:
    from mpi4py import MPI  # noqa: F401
    _NO_MPI = []
except (ImportError, RuntimeError, OSError):
    _NO_MPI = ["mpi4py.MPI"]

import mpisphere  # noqa: E402

project = "mpisphere"
author = "the mpisphere developers"
copyright = "2026, the mpisphere developers"
release = mpisphere.__version__
version = release

extensions = [
    "myst_parser",
    "numpydoc",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "results/*.md", "Thumbs.db", ".DS_Store"]
templates_path = ["_templates"]  # the class pages: autodoc documents each class's own members (no table of inherited ones)
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3

autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"members": True, "inherited-members": False, "show-inheritance": True}
autodoc_typehints = "none"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

# Intersphinx needs the network; the build must not (CI machines and clusters are often offline).
# MPISPHERE_DOCS_INTERSPHINX=1 turns the links on where the inventories can be fetched.
intersphinx_mapping = {}
if os.environ.get("MPISPHERE_DOCS_INTERSPHINX") == "1":
    intersphinx_mapping = {
        "python": ("https://docs.python.org/3", None),
        "numpy": ("https://numpy.org/doc/stable", None),
        "mpi4py": ("https://mpi4py.readthedocs.io/en/stable", None),
        "scipy": ("https://docs.scipy.org/doc/scipy", None),
        "cupy": ("https://docs.cupy.dev/en/stable", None),
    }

# Optional extras the API pages document but a docs build need not install: imported as mocks when absent.
_OPTIONAL = ("torch", "cupy", "cupyx", "pylops_mpi", "pylops", "zarr", "ducc0", "pytest")
autodoc_mock_imports = _NO_MPI + [name for name in _OPTIONAL if importlib.util.find_spec(name) is None]

html_theme = "pydata_sphinx_theme"
html_title = f"mpisphere {release}"
html_static_path = []
html_theme_options = {
    "navigation_depth": 3,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}
html_show_sourcelink = False

sys.path.insert(0, os.path.abspath("."))

# sphinx-build -n (nitpicky): the base classes "Bases:" names that are not pages of their own: private ones,
# the internal bases of the public classes (their members show on the public pages), and PyTorch's Module
# (torch.nn.modules.module.Module is how the base reads when torch is installed, torch.nn.Module when it is mocked)
nitpick_ignore_regex = [("py:class", r"mpisphere\.[\w.]*\._\w+"), ("py:class", r"torch\.nn\.(modules\.module\.)?Module")]
nitpick_ignore = [("py:class", "mpisphere.sht.transforms.Transform"),
                  ("py:class", "mpisphere.operators.base.AdjointOperator"),
                  ("py:class", "mpisphere.comm_operator.CommunicatorOperator"),
                  ("py:class", "mpisphere.attention.base.Attention"),
                  ("py:class", "mpisphere.torch_layers.ParametrisedLayer")]
