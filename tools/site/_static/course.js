/* The course's website: fixes on top of sphinx-book-theme 1.4 / pydata-sphinx-theme 0.20 (tests/test_site.py
   checks each in headless Chromium). */
"use strict";

/* 1. The ☰ (lessons) and ☷ (page contents) buttons. Both themes bind their handlers to the FIRST element with
   the class (document.querySelector(".primary-toggle")), which is a hidden duplicate in the top bar, so the
   visible buttons in the article's header did nothing. A click on any other such button is passed on to it. */
function courseForwardSidebarToggles() {
  for (const cls of ["primary-toggle", "secondary-toggle"]) {
    const first = document.querySelector("." + cls);
    document.querySelectorAll("." + cls).forEach((button) => {
      if (button === first) return;
      button.addEventListener("click", (event) => {
        event.preventDefault();
        event.stopPropagation();
        button.blur();
        first.click();
      });
    });
  }
}

/* A link chosen in the ☰ or ☷ dialog closes it (else the dialog stays over the section it just scrolled to). */
function courseCloseDialogOnLink() {
  document.querySelectorAll("dialog").forEach((dialog) => {
    dialog.addEventListener("click", (event) => {
      if (dialog.open && event.target.closest("a[href]")) dialog.close();
    });
  });
}

/* 2. A page opened from a search result. Sphinx's sphinx_highlight.js marks the words searched for only where
   searchtools.js is absent, and the theme loads that on every page (for its search dialog): nothing was marked,
   and the page opened at its top. Mark them here (SphinxHighlight, a moment later) and scroll the first match in
   the lesson into view, unless the link named a place (#anchor). The words are read before anything consumes
   them. */
const courseSearched = (() => {
  try {
    return localStorage.getItem("sphinx_highlight_terms") || new URL(window.location).searchParams.get("highlight");
  } catch (e) {
    return null;
  }
})();

function courseScrollToSearchMatch(tries) {
  if (!courseSearched || document.getElementById("search-results") || window.location.hash) return;
  const match = document.querySelector("article span.highlighted");
  if (match) {
    match.scrollIntoView({ block: "center" });
  } else if (tries > 0) {
    window.setTimeout(() => courseScrollToSearchMatch(tries - 1), 50);
  }
}

/* 3. The page contents list highlights the section being read: the last heading above the reading line (just
   under the sticky header), not a heading that has only come into the top third of the window. */
function courseTocFollowsReading() {
  const links = [...document.querySelectorAll("#pst-page-toc-nav a.nav-link[href^='#']")];
  const pairs = links
    .map((link) => {
      const target = document.getElementById(decodeURIComponent(link.getAttribute("href").slice(1)));
      const heading = target && (target.querySelector("h1,h2,h3,h4,h5,h6") || target);
      return heading ? { link, heading } : null;
    })
    .filter(Boolean);
  if (!pairs.length) return;
  const header = document.querySelector(".bd-header-article");
  let pending = 0;
  const update = () => {
    pending = 0;
    const line = (header ? header.getBoundingClientRect().bottom : 0) + 16;
    let current = pairs[0];
    for (const p of pairs) {
      if (p.heading.getBoundingClientRect().top <= line) current = p;
    }
    // At the very bottom of the page the last sections cannot reach the line: take the last one on screen.
    if (window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 2) {
      const onScreen = pairs.filter((p) => p.heading.getBoundingClientRect().top < window.innerHeight);
      if (onScreen.length) current = onScreen[onScreen.length - 1];
    }
    links.forEach((link) => {
      const on = link === current.link;
      link.classList.toggle("active", on);
      if (on) link.setAttribute("aria-current", "true");
      else link.removeAttribute("aria-current");
    });
    document.querySelectorAll("#pst-page-toc-nav li").forEach((li) => {
      li.classList.toggle("active", li.contains(current.link));
    });
  };
  // After the theme's own observer (it runs when a heading crosses the top third): ours has the last word.
  const schedule = () => {
    if (!pending) pending = window.setTimeout(update, 60);
  };
  window.addEventListener("scroll", schedule, { passive: true });
  window.addEventListener("resize", schedule);
  schedule();
}

document.addEventListener("DOMContentLoaded", () => {
  courseForwardSidebarToggles();
  courseCloseDialogOnLink();
  courseTocFollowsReading();
});
window.addEventListener("load", () => {
  if (!courseSearched || document.getElementById("search-results")) return;
  if (!document.querySelector("span.highlighted") && typeof SphinxHighlight !== "undefined") {
    SphinxHighlight.highlightSearchWords();
  }
  courseScrollToSearchMatch(40);
});
