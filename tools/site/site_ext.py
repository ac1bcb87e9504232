"""The course site's own Sphinx hooks (tools/site/conf.py loads this as an extension)."""

from docutils import nodes
from latex2mathml.converter import convert as latex_to_mathml
from sphinx.util import logging

LOGGER = logging.getLogger(__name__)


def jupyterlab_slug(title: str) -> str:
    """A heading's anchor as JupyterLab makes it, the form the notebooks link with: its text, spaces as hyphens
    (`[see](11_checkpoints_and_profiles.ipynb#Several-processes-save-together)`)."""
    return title.strip().replace(" ", "-")


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
            LOGGER.warning(
                f"remote image {image['uri']!r}: store the picture in the notebook (an output or an attachment), "
                "so that the site shows it offline", location=(docname, image.line))


def add_kaggle_launch_button(app, pagename, templatename, context, doctree):
    """sphinx-book-theme has Binder and Colab launch buttons; add Kaggle beside them (same URL as the badges)."""
    for group in context.get("header_buttons", []):
        if group.get("label") == "launch-buttons":
            options = app.config.html_theme_options
            source = app.env.doc2path(pagename, False)
            url = (f"https://kaggle.com/kernels/welcome?src={options['repository_url']}/blob/"
                   f"{options['repository_branch']}/{source}")
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
    return {"parallel_read_safe": True, "parallel_write_safe": True}
