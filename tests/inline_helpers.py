"""What a notebook front end shows of an HTML output, seen in headless Chromium."""

from __future__ import annotations

from pathlib import Path


def text_in_frame(open_page, path: Path, fragment: str) -> str:
    """Put an output's ``text/html`` into a page of its own, open it, and return the text inside its one frame.

    Fails unless the output is exactly one frame, and the page caused no console error and no request
    for anything but itself.
    """
    path.write_text(f"<!DOCTYPE html><html><body>{fragment}</body></html>", encoding="utf-8")
    run = open_page(path)
    frames = [frame for frame in run.page.frames if frame != run.page.main_frame]
    assert len(frames) == 1, fragment[:200]
    text = frames[0].evaluate("document.body.innerText")
    run.assert_clean()
    return text
