"""Render a local HTML file in Debian's Chromium with networking off; return its DOM and console log."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest

#: Tags whose URL attribute the browser loads by itself.
LOADING_TAGS = {"script": "src", "link": "href", "img": "src", "iframe": "src", "source": "src", "embed": "src",
                "video": "src", "audio": "src", "object": "data"}  # fmt: skip


def chromium() -> str:
    """Path of chromium; skips the test without it, fails it when CI is set (CI installs it)."""
    path = shutil.which("chromium")
    if path is None:
        message = "chromium is not installed (apt-get install chromium; make test installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def render(page: Path, timeout: float = 120.0) -> tuple[str, str]:
    """``chromium --headless --dump-dom`` with every host unresolvable: (DOM, console log)."""
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [
                chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=5000",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
                "--dump-dom", page.resolve().as_uri(),
            ],  # fmt: skip
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, proc.stderr


def console_errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if "CONSOLE" in line and "Uncaught" in line]


class _Sources(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str]] = []

    def handle_starttag(self, tag, attrs):
        attribute = LOADING_TAGS.get(tag)
        for name, value in attrs:
            if name == attribute and value:
                self.urls.append((tag, value))


def remote_sources(text: str) -> list[tuple[str, str]]:
    """(tag, url) of every loading tag whose URL is not inline (``data:``) or relative."""
    parser = _Sources()
    parser.feed(text)
    return [(tag, url) for tag, url in parser.urls if url.startswith(("http:", "https:", "//", "ftp:"))]
