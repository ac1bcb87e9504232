"""Sphinx configuration of the course's website, built from the notebooks' stored outputs (nothing is executed).

Build it with ``./course.sh site`` (tools/site/build.py stages the sources and runs Sphinx with warnings as
errors). The pages: ``index.md`` (this folder: the landing page and the lesson list) and every
``notebooks/*.ipynb``, one page each, in file-name order.
"""

import pathlib
import sys
import tomllib

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # site_ext.py, beside this file

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
REPOSITORY = PYPROJECT["project"]["urls"]["Repository"]  # https://github.com/<org>/<repo>
ORG, REPO = REPOSITORY.removeprefix("https://github.com/").split("/")[:2]
# The launch buttons open the notebooks at the course's one git ref (as the notebooks' own badges do, and their
# install cell installs course_lib from it): pyproject's [tool.course] ref, read by tools/install_cell.py too.
BRANCH = PYPROJECT["tool"]["course"]["ref"]

project = "SPMD data parallelism in JAX"
author = "the course's authors"
copyright = "the course's authors, Apache-2.0"
release = PYPROJECT["project"]["version"]

extensions = ["myst_nb", "site_ext"]  # site_ext.py: launch badges, Kaggle button, MathML, anchors
root_doc = "index"
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
# A notebook that is not in the lesson list (index.md's toctree) fails the build ("not included in any toctree").

# The stored outputs are the site (nbval re-runs the notebooks in the tests and compares them with these).
nb_execution_mode = "off"
# No widget JavaScript from a CDN (the site works offline); a stored widget (a progress bar) shows its text form.
nb_ipywidgets_js = {}
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None)]
myst_enable_extensions = ["dollarmath"]
# Formulas become MathML when the site is built (browsers draw it natively): no MathJax from a CDN.
html_math_renderer = "mathml"
myst_heading_anchors = 6  # links to headings resolve, and a broken one is a warning (so an error)

myst_heading_slug_func = "site_ext.jupyterlab_slug"  # JupyterLab's anchors, as the notebooks link

html_theme = "sphinx_book_theme"
html_baseurl = f"https://{ORG}.github.io/{REPO}/"  # where CI publishes it (GitHub Pages, from main)
html_title = project
html_static_path = ["_static"]
html_css_files = ["course.css"]
html_js_files = ["course.js"]
html_context = {"default_mode": "auto"}  # without it the theme logs "Got invalid theme mode: ." in the console  # the ☰/☷ buttons, the search match, the contents list (see the file)
html_favicon = "_static/favicon.svg"
# One search: the button in the article's header (and Ctrl+K), not a second field in the lesson list.
html_sidebars = {"**": ["navbar-logo.html", "icon-links.html", "sbt-sidebar-nav.html"]}
html_last_updated_fmt = None
html_copy_source = True  # the page's "download .ipynb" button serves the notebook from _sources/
html_theme_options = {
    "repository_url": REPOSITORY,
    "repository_branch": BRANCH,
    "path_to_docs": "",
    "use_repository_button": True,
    "use_download_button": True,
    "use_source_button": False,
    "use_issues_button": False,
    "use_edit_page_button": False,
    "show_toc_level": 2,
    "launch_buttons": {
        "binderhub_url": "https://mybinder.org",
        "colab_url": "https://colab.research.google.com",
        "notebook_interface": "jupyterlab",
    },
}

