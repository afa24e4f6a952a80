"""The explorer in a real browser over the database of a real short run.

The run is the session's `short_demo` (tests/integration/conftest.py: Anvil, local store, SQLite, a
coordinator, three workers of which one forges its rewards, a verifier checking every commit, a
minute of training, every version audited), which test_demo_end_to_end checks too; a module
fixture serves `krill explorer` as its own process over that database and store. Debian's Chromium, driven by Playwright's sync API with
`executable_path` (no browser download), walks the pages; screenshots go to
test-artifacts/explorer/.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(600)

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "explorer"


def _require_browser():
    if not CHROMIUM.exists():
        pytest.skip("Debian chromium is not installed at /usr/bin/chromium (`make test` installs it as root "
                    "through scripts/test-services.sh)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("the playwright package is missing: pip install -e .[dev]")


@pytest.fixture(scope="module")
def demo_dir(short_demo):
    _require_browser()
    assert short_demo.summary["versions"] >= 2, short_demo.lines
    assert any(w["slashed"] for w in short_demo.summary["workers"]), short_demo.lines
    return short_demo.workdir


@pytest.fixture(scope="module")
def explorer_url(demo_dir):
    env = {**os.environ, "KRILL_HOME": str(demo_dir / "home")}
    env.pop("KRILL_CONFIG", None)
    log = open(demo_dir / "logs" / "explorer.log", "wb")  # noqa: SIM115 (closed at teardown)
    proc = subprocess.Popen([sys.executable, "-m", "krill.cli", "--config", str(demo_dir / "coordinator.toml"),
                             "explorer", "--port", "0", "--audit-report", str(demo_dir / "summary.json"), "--quiet"],
                            stdout=subprocess.PIPE, stderr=log, env=env)
    try:
        selector = selectors.DefaultSelector()
        selector.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + 60
        line = b""
        while time.monotonic() < deadline and not line.endswith(b"\n") and proc.poll() is None:
            if selector.select(timeout=0.5):
                line += proc.stdout.read1(4096) if hasattr(proc.stdout, "read1") else proc.stdout.readline()
        found = re.search(rb"http://127\.0\.0\.1:(\d+)/", line)
        assert found, f"the explorer did not start: {line!r}; see {demo_dir / 'logs' / 'explorer.log'}"
        yield f"http://127.0.0.1:{int(found[1])}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdout.close()
        log.close()


@pytest.fixture(scope="module")
def browser(explorer_url):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    """A page that records console errors (a CSP violation is one) and any dialog (an injected alert)."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    pg.errors, pg.dialogs = [], []
    pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
    yield pg
    context.close()


def _shot(pg, name: str) -> None:
    pg.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def test_overview_renders_with_svg_charts_and_headers(page, explorer_url):
    response = page.goto(explorer_url + "/")
    assert response.status == 200
    headers = response.headers
    assert "default-src 'none'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff" and headers["x-frame-options"] == "DENY"
    assert headers["referrer-policy"] == "no-referrer"
    charts = page.locator("#charts svg.chart")
    assert charts.count() == 4
    for name in ("Eval accuracy", "Mean reward", "Contributions per version", "Throughput"):
        assert page.locator(f"#charts svg[aria-label^='{name}']").count() == 1, name
    assert page.locator("#charts svg rect.bar").count() >= 2
    assert page.locator("#charts svg polyline.series").count() >= 2
    box = charts.first.bounding_box()
    assert box and box["width"] > 300 and box["height"] > 100
    # The same-origin stylesheet applied (the CSP let it through), and nothing was blocked or failed.
    assert page.evaluate("getComputedStyle(document.querySelector('header.top')).backgroundColor") == \
        "rgb(246, 248, 250)"
    assert page.errors == []
    assert "slashes" in page.locator("#summary").inner_text()
    _shot(page, "overview")


def test_versions_page_and_a_version(page, explorer_url):
    page.goto(explorer_url + "/")
    page.click("header nav >> text=Versions")
    page.wait_for_url(re.compile(r".*/versions$"))
    rows = page.locator("#versions tr")
    assert rows.count() >= 3
    assert page.locator("#versions .audit-passed").count() >= 1  # `krill audit` ran on the last versions
    _shot(page, "versions")
    page.locator("#versions tr").nth(2).locator("a").first.click()
    page.wait_for_url(re.compile(r".*/versions/\d+$"))
    assert page.locator("#manifest-cid").inner_text().startswith("baf")
    assert page.locator("#shards tr").count() == 3  # header + two shards
    assert page.locator("#record-accepted tr").count() >= 2 and page.locator("#record-shards tr").count() == 3
    assert page.errors == []
    _shot(page, "version")


def test_from_a_slashed_worker_to_the_evidence_that_slashed_it(page, explorer_url):
    page.goto(explorer_url + "/participants")
    slashed = page.locator("#participants tr.slashed")
    assert slashed.count() == 1 and "jailed" in slashed.inner_text()
    _shot(page, "participants")
    slashed.locator("a").first.click()
    page.wait_for_url(re.compile(r".*/participants/0x[0-9a-f]{40}$"))
    worker = page.url.rsplit("/", 1)[1]
    # Rejected as wrong_rewards by the coordinator, or as jailed when the verifier's slash came first.
    assert page.locator("#slashes").count() == 1 and page.locator("table.slashes tr.slash").count() >= 1
    _shot(page, "slashed-worker")
    page.locator("table.slashes a.evidence-link").first.click()
    page.wait_for_url(re.compile(r".*/evidence/[0-9a-f]{64}$"))
    assert page.locator("#evidence-facts a").get_attribute("href").endswith(worker)
    assert page.locator("#evidence-reason").inner_text() == "rewards"
    assert page.locator("#evidence-checks tr.check-failed").count() >= 1
    assert "yes" in page.locator("#evidence-document").inner_text()
    _shot(page, "evidence")
    page.locator("#evidence-verdicts a").first.click()
    page.wait_for_url(re.compile(r".*/contributions/\d+$"))
    assert "slashed" in page.locator("h1").inner_text()
    assert page.locator("#signature-now").inner_text().startswith("valid")
    assert page.locator("#commit-tx").inner_text().startswith("0x")
    assert page.errors == []
    _shot(page, "contribution")


def test_injection_in_a_query_parameter_is_harmless(page, explorer_url):
    attack = "<script>alert(1)</script>' OR 1=1 --"
    response = page.goto(explorer_url + "/contributions?worker=" + attack.replace("#", "%23"))
    assert response.status == 400
    assert "<script>alert(1)</script>" in page.locator("#error-message").inner_text()  # shown as text
    assert page.locator("main script").count() == 0
    page.goto(explorer_url + "/")
    page.fill("input[name=q]", "\"><img src=x onerror=alert(1)>")
    page.press("input[name=q]", "Enter")
    page.wait_for_load_state()
    assert page.locator("#error-message").count() == 1 and page.locator("main img").count() == 0
    response = page.goto(explorer_url + "/participants?per_page=1&page=1&run=' OR '1'='1")
    assert response.status == 200 and page.locator("#participants tr.participant").count() == 1
    api = page.request.get(explorer_url + "/api/contributions?status=rejected' OR '1'='1")
    assert api.status == 400 and "error" in api.json()
    assert page.dialogs == []
    _shot(page, "injection")
    listed = page.request.get(explorer_url + "/api/participants?per_page=2").json()
    assert listed["per_page"] == 2 and len(listed["items"]) == 2 and listed["total"] >= 4
