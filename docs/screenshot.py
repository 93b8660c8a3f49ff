"""Screenshot an attnviz HTML page in headless Chromium (for the images in docs/images).

    python docs/screenshot.py view.html docs/images/head-view.png --click "#tab-model" --click "td.cell"

Each ``--select SELECTOR=VALUE`` picks an option first; each ``--click SELECTOR`` clicks the first match, ``--hover SELECTOR`` points at it, in order.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from playwright.sync_api import sync_playwright


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("page", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--click", action="append", default=[])
    parser.add_argument("--hover", action="append", default=[])
    parser.add_argument("--select", action="append", default=[], help="SELECTOR=VALUE, chosen before the clicks")
    parser.add_argument("--width", type=int, default=1200)
    parser.add_argument("--height", type=int, default=800)
    parser.add_argument("--full", action="store_true")
    args = parser.parse_args()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": args.width, "height": args.height})
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        # attention pages mark their body data-ready="true" once drawn (long pages decode their data first)
        ready = "!document.body.hasAttribute('data-ready') || document.body.dataset.ready === 'true'"
        page.goto(args.page.resolve().as_uri())
        page.wait_for_function(ready)
        for choice in args.select:
            selector, value = choice.rsplit("=", 1)
            page.select_option(selector, value)
            page.wait_for_function(ready)
        for kind, selector in [("click", s) for s in args.click] + [("hover", s) for s in args.hover]:
            getattr(page.locator(selector).first, kind)()
            page.wait_for_function(ready)
        page.screenshot(path=str(args.out), full_page=args.full)
        browser.close()
    for error in errors:
        print("console error:", error)


if __name__ == "__main__":
    main()
