"""Sphinx configuration of the course's website, built from the notebooks' stored outputs (nothing is executed).

Build it with ``./course.sh site`` (tools/site/build.py stages the sources and runs Sphinx with warnings as
errors). The pages: ``index.md`` (this folder: the landing page and the lesson list) and every
``notebooks/*.ipynb``, one page each, in file-name order.
"""

import pathlib
import tomllib

from docutils import nodes
from latex2mathml.converter import convert as latex_to_mathml

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
REPOSITORY = PYPROJECT["project"]["urls"]["Repository"]  # https://github.com/<org>/<repo>
ORG, REPO = REPOSITORY.removeprefix("https://github.com/").split("/")[:2]
BRANCH = "main"  # the launch buttons open the notebooks of this branch (as the notebooks' own badges do)

project = "SPMD data parallelism in JAX"
author = "the course's authors"
copyright = "the course's authors, Apache-2.0"
release = PYPROJECT["project"]["version"]

extensions = ["myst_nb"]
root_doc = "index"
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
# A notebook that is not in the lesson list (index.md's toctree) fails the build ("not included in any toctree").

# The stored outputs are the site: nbval has checked that they are what the code prints today.
nb_execution_mode = "off"
# No widget JavaScript from a CDN (the site works offline); a stored widget (a progress bar) shows its text form.
nb_ipywidgets_js = {}
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None)]
myst_enable_extensions = ["dollarmath"]
# Formulas become MathML when the site is built (browsers draw it natively): no MathJax from a CDN.
html_math_renderer = "mathml"
myst_heading_anchors = 3  # `[text](#a-heading)` links work, and a broken one is a warning (so an error)

html_theme = "sphinx_book_theme"
html_baseurl = f"https://{ORG}.github.io/{REPO}/"  # where CI publishes it (GitHub Pages, from main)
html_title = project
html_static_path = ["_static"]
html_css_files = ["course.css"]
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

# Links to the notebooks' Colab and Kaggle badges: on the site the page header has the launch buttons instead.
BADGE_TARGETS = ("https://colab.research.google.com/", "https://kaggle.com/kernels/welcome")


def remove_badges_and_check_images(app, doctree):
    """Drop the notebooks' launch badges (remote pictures) and refuse any other remote picture: the site works
    offline, and the browser test checks that every picture on every page loads."""
    docname = app.env.docname
    for ref in list(doctree.findall(nodes.reference)):
        if ref.get("refuri", "").startswith(BADGE_TARGETS) and any(True for _ in ref.findall(nodes.image)):
            parent = ref.parent
            parent.remove(ref)
            if isinstance(parent, nodes.paragraph) and not parent.astext().strip():
                parent.parent.remove(parent)
    for image in doctree.findall(nodes.image):
        if "://" in image.get("uri", ""):
            from sphinx.util import logging
            logging.getLogger(__name__).warning(
                f"remote image {image['uri']!r}: store the picture in the notebook (an output or an attachment), "
                "so that the site shows it offline", location=(docname, image.line))


def add_kaggle_launch_button(app, pagename, templatename, context, doctree):
    """sphinx-book-theme has Binder and Colab launch buttons; add Kaggle beside them (same URL as the badges)."""
    for group in context.get("header_buttons", []):
        if group.get("label") == "launch-buttons":
            source = app.env.doc2path(pagename, False)
            url = f"https://kaggle.com/kernels/welcome?src={REPOSITORY}/blob/{BRANCH}/{source}"
            group["buttons"].append({"type": "link", "text": "Kaggle", "tooltip": "Launch on Kaggle",
                                     "icon": "fab fa-kaggle", "url": url})


def visit_math(self, node):
    self.body.append(latex_to_mathml(node.astext()))
    raise nodes.SkipNode


def visit_math_block(self, node):
    self.body.append(f'<div class="math-display">{latex_to_mathml(node.astext(), display="block")}</div>')
    raise nodes.SkipNode


def setup(app):
    app.add_html_math_renderer("mathml", (visit_math, None), (visit_math_block, None))
    app.connect("doctree-read", remove_badges_and_check_images)
    app.connect("html-page-context", add_kaggle_launch_button, priority=600)  # after the theme's (501)
