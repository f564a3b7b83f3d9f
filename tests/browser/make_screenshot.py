"""Draw docs/dashboard.png: the page of a finished sweep and its split search, at 1280x800.

usage: python tests/browser/make_screenshot.py [OUT]   (needs playwright and /usr/bin/chromium)
It runs a real daemon with the split search on and a sweep of tests/browser/demo_trial.py.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from harness import VIEWPORT, daemon, launch, submit
from playwright.sync_api import expect, sync_playwright

ROOT = Path(__file__).resolve().parents[2]
# Short measuring windows: the demo's trials take a second or two each.
TUNING = {"GPUMUX_SPLIT_SETTLE": "0.5", "GPUMUX_SPLIT_WINDOW": "1.5"}


def main(out: Path) -> None:
    """Run the demo sweep to its end, then photograph its page."""
    with tempfile.TemporaryDirectory() as tmp, daemon(Path(tmp) / "home", TUNING) as served:
        sweep_id = submit(
            served,
            ROOT,
            [sys.executable, "tests/browser/demo_trial.py"],
            params=["lr=1e-4..1e-1:8", "width=32,64,128", "epochs=150"],
            objective="val_loss:min",
            name="demo: lr x width",
        )
        with sync_playwright() as playwright:
            browser = launch(playwright)
            page = browser.new_page(viewport=VIEWPORT)
            page.goto(served.page(f"#/sweeps/{sweep_id}"))
            expect(page.locator(".sweep-status")).to_have_text("finished", timeout=600_000)
            expect(page.locator("figure.chart").first).to_be_visible()
            page.screenshot(path=out)
            browser.close()
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "dashboard.png")
