"""Sphinx configuration of the documentation site.

Build it with ``.venv/bin/sphinx-build -W --keep-going -b html docs docs/_build/html``.
"""

from __future__ import annotations

import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the package, from the clone
sys.path.insert(0, os.path.join(HERE, "_ext"))

# autodoc imports the Airflow layer, and Airflow reads its configuration on import: give it a home of
# its own unless one is set, so that building the docs never writes to ~/airflow.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="sqlqueue-docs-airflow-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

from airflow_provider_sqlqueue import __version__  # noqa: E402

project = "airflow-provider-sqlqueue"
author = "The airflow-provider-sqlqueue authors"
copyright = "The airflow-provider-sqlqueue authors"  # noqa: A001  # Sphinx's name for it
release = __version__
version = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sqlqueue_docs",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3

html_theme = "alabaster"
html_title = "airflow-provider-sqlqueue"
html_theme_options = {"description": "NServiceBus-compatible queues in PostgreSQL and SQL Server tables, for Airflow"}

autodoc_member_order = "bysource"
autodoc_typehints = "signature"  # each parameter's type where it is named, as the code declares it
python_use_unqualified_type_names = True  # ``QueueAddress``, not its module path, wherever it is documented
autodoc_default_options = {"members": True, "show-inheritance": True}
