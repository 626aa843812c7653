"""The documentation site as a reader's browser shows it: headless Chromium at 1280 px.

Every page of the built site (``make docs``'s ``docs/_build/html``, or a fresh build when that is
missing or older than its sources) is loaded in Debian's ``chromium`` through ``chromedriver``:

* the left "Section Navigation" lists the pages of the page's section;
* a table or code block wider than the article scrolls inside its own box (nothing is cut off
  or runs off the page);
* a figure shown smaller than its file links to the full-size file, and is shown at the article's
  width;
* no raw placeholder (``<scratch>``) was swallowed as an HTML tag, no link points at a server of
  the machine that ran a notebook (``127.0.0.1``), and no script loads from another host.

Screenshots of the index, a guide page and the benchmark page are written to
``docs/_build/screenshots/`` (kept as CI artifacts). Without Chromium the test is skipped, except
under CI (``CI`` set), where ``.ci/run`` installs it and a missing browser is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BUILT = DOCS / "_build" / "html"
SCREENSHOTS = DOCS / "_build" / "screenshots"
WIDTH, HEIGHT = 1280, 900
#: pages outside every section (the home page, the generated indexes)
UNSECTIONED = {"index.html", "genindex.html", "search.html", "py-modindex.html"}
Measured = dict[str, dict[str, Any]]
SHOTS = {
    "index.html": "index.png",
    "guide/quickstart.html": "guide-quickstart.png",
    "guide/covariance-benchmark.html": "covariance-benchmark.png",
}

webdriver = pytest.importorskip("selenium.webdriver", reason="extra [docs]: selenium")
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


def _sources_mtime() -> float:
    paths = [DOCS / "conf.py", *DOCS.glob("_static/*"), *(ROOT / "notebooks").glob("*.ipynb")]
    paths += [p for p in DOCS.rglob("*.md") if "_build" not in p.parts]
    return max(p.stat().st_mtime for p in paths)


@pytest.fixture(scope="module")
def site() -> Path:
    """The built site: ``make docs``'s when it is newer than the sources, else built again there
    (as ``make docs`` does)."""
    index = BUILT / "index.html"
    if not index.exists() or index.stat().st_mtime < _sources_mtime():
        cmd = [sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-q", "-b", "html"]
        subprocess.run([*cmd, str(DOCS), str(BUILT)], check=True, cwd=ROOT)
    return BUILT


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium (Debian's ``chromium`` and ``chromium-driver``) at 1280 x 900."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        if os.environ.get("CI"):
            pytest.fail("CI needs chromium and chromedriver (.ci/run installs them)")
        pytest.skip("no chromium or chromedriver (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.add_argument(f"--window-size={WIDTH},{HEIGHT}")
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _pages(site: Path) -> list[str]:
    return sorted(
        p.relative_to(site).as_posix()
        for p in site.rglob("*.html")
        if not {"_modules", "_static", "_sources", "_images"} & set(p.relative_to(site).parts)
    )


#: one page's layout facts, measured by the browser
_MEASURE = (Path(__file__).parent / "docs_measure.js").read_text()


@pytest.fixture(scope="module")
def measured(site: Path, browser: Any) -> Measured:
    """Every page's measurements (and the screenshots)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    out = {}
    for page in _pages(site):
        browser.get((site / page).as_uri())
        # get() may return while a file:// page is still parsing: measure the loaded page only
        WebDriverWait(browser, 30).until(
            lambda b: b.execute_script("return document.readyState") == "complete"
        )
        out[page] = browser.execute_script(_MEASURE)
        if page in SHOTS:
            browser.save_screenshot(str(SCREENSHOTS / SHOTS[page]))
    return out


def test_every_section_page_has_its_section_navigation(measured: Measured) -> None:
    empty = [p for p, m in measured.items() if p not in UNSECTIONED and m["sidebar"] == 0]
    assert len(measured) > 30
    assert not empty, f"pages with an empty Section Navigation: {empty}"


def test_nothing_wide_is_cut_off(measured: Measured) -> None:
    cut = {p: m["cut"] for p, m in measured.items() if m["cut"]}
    assert not cut, cut


def test_figures_fill_the_article_and_open_at_full_size(measured: Measured) -> None:
    bench = measured["guide/covariance-benchmark.html"]
    (fig,) = [f for f in bench["figures"] if f["src"].endswith("covariance_bench.png")]
    assert fig["shown"] >= 0.95 * bench["article"] > 600, fig
    assert fig["natural"] > fig["shown"]
    assert fig["href"] is not None and fig["href"].endswith("covariance_bench.png"), fig
    for page, m in measured.items():
        for f in m["figures"]:
            if f["natural"] > f["shown"] + 1 and f["natural"] > 0:
                assert f["href"] is not None, (page, f)


def test_no_placeholder_dead_local_link_or_remote_script(measured: Measured) -> None:
    keys = ("placeholders", "text_placeholders", "local_links", "remote_scripts")
    bad = {p: {k: m[k] for k in keys if m[k]} for p, m in measured.items()}
    bad = {p: v for p, v in bad.items() if v}
    assert not bad, bad


def test_screenshots_are_kept(measured: Measured) -> None:
    for name in SHOTS.values():
        shot = SCREENSHOTS / name
        assert shot.stat().st_size > 10_000, shot
