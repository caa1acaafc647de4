"""Headless Chromium for the explorer's browser tests (Debian's ``chromium`` driven by playwright): the browser, a page
opened offline that records its console errors and requests, and the audio check of a speech page.

Imported as ``browser_page`` by the tests in this folder and as ``explorer.browser_page`` by tests/test_train_tts.py.
"""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from helpers import load_factor

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def missing() -> str | None:
    """Why no browser test can run here (the skip reason), or None."""
    if CHROMIUM is None:
        return "Debian's chromium is not installed (.ci/run installs it)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "pip install playwright (the dev extra)"
    return None


@contextmanager
def chromium():
    """The launched browser, or None where :func:`missing` says why not."""
    if missing() is not None:
        yield None
        return
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


@dataclass
class OpenPage:
    ctx: object
    page: object
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)


@contextmanager
def open_page(browser, path: Path, width: int = 1200, height: int = 1000):
    """``path`` opened with the network off, once the page says it is ready (``body[data-ready='1']``); collects
    console errors, page errors and every request. Closed on exit."""
    ctx = browser.new_context(offline=True, viewport={"width": width, "height": height})
    # playwright's default 30 s for every wait (the page loading, getting ready) holds on an idle machine only
    ctx.set_default_timeout(30_000 * load_factor())
    opened = OpenPage(ctx, ctx.new_page())
    page = opened.page
    page.on("console", lambda m: opened.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: opened.errors.append(str(e)))
    page.on("request", lambda r: opened.requests.append(r.url))
    try:
        page.goto(Path(path).as_uri())
        page.wait_for_selector("body[data-ready='1']")
        yield opened
    finally:
        ctx.close()


def audio_duration(page) -> float:
    """The speech page's ``#audio``: visible, its source a ``data:`` URI, and the seconds the browser decodes from it
    (its metadata loaded; an undecodable source raises with the media error code)."""
    assert page.is_visible("#audio"), "the speech page shows no audio player"
    src = page.eval_on_selector("#audio", "a => a.src")
    assert src.startswith("data:audio/wav;base64,"), src[:60]
    return page.eval_on_selector("#audio", """a => new Promise((ok, fail) => {
        const done = () => ok(a.duration);
        if (a.readyState >= 1) return done();
        a.addEventListener("loadedmetadata", done, {once: true});
        a.addEventListener("error", () => fail(new Error("audio error " + (a.error && a.error.code))), {once: true});
        a.load();
    })""")
