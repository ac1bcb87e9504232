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

/* 1b. The lesson list on a small laptop or a landscape tablet (992 to 1279 px). Beside the lesson it would leave
   the code a column of about 720 px; folded, about 990. So it starts folded there and ☰ shows it (below 992 px
   the theme opens it as a dialog; from 1280 px it starts shown). Whichever way the learner leaves it is
   remembered, per width band, from page to page (localStorage; nothing is sent anywhere). sphinx-book-theme
   folds it with the class pst-sidebar-hidden, which its own ☰ handler toggles; this only sets the start and
   watches the class. */
const COURSE_FOLD_MEDIA = "(min-width: 992px) and (max-width: 1279.98px)";

function courseLessonListBand() {
  if (window.matchMedia(COURSE_FOLD_MEDIA).matches) return "narrow";
  return window.matchMedia("(min-width: 1280px)").matches ? "wide" : null;
}

function courseRememberedFold(band) {
  try {
    const saved = localStorage.getItem("course_lesson_list_" + band);
    if (saved === "folded" || saved === "shown") return saved === "folded";
  } catch (e) {
    /* storage refused (a private window): the default below */
  }
  return band === "narrow";
}

function courseFoldLessonList() {
  const sidebar = document.getElementById("pst-primary-sidebar");
  if (!sidebar) return;
  let applying = false;
  const apply = () => {
    const band = courseLessonListBand();
    if (!band) return;
    applying = true;
    sidebar.classList.toggle("pst-sidebar-hidden", courseRememberedFold(band));
    applying = false;
  };
  apply();
  new MutationObserver(() => {
    const band = courseLessonListBand();
    if (applying || !band) return;
    try {
      const folded = sidebar.classList.contains("pst-sidebar-hidden");
      localStorage.setItem("course_lesson_list_" + band, folded ? "folded" : "shown");
    } catch (e) {
      /* storage refused: the choice lasts for this page only */
    }
  }).observe(sidebar, { attributes: true, attributeFilter: ["class"] });
  window.matchMedia(COURSE_FOLD_MEDIA).addEventListener("change", apply);
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
  courseFoldLessonList();
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
