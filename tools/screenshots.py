"""Take the README's screenshots of ``durable-log serve`` on a ``durable-log demo`` store (never on
test data): the demo is run into a temporary directory, its word index built, ``serve`` started on
a free loopback port, and Debian's headless Chromium (through Playwright) opens each page.

Usage: python -m tools.screenshots [--out docs/screenshots] [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DURABLE_LOG = [sys.executable, "-m", "pi_durable_lmdb.cli"]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="screenshots-") as parent:
        store = os.path.join(parent, "demo-store")
        subprocess.run([*DURABLE_LOG, "demo", store], check=True, capture_output=True, timeout=120)
        subprocess.run(
            [*DURABLE_LOG, "search", store, "answer"], check=True, capture_output=True, timeout=120
        )
        server = subprocess.Popen(
            [*DURABLE_LOG, "serve", store, "--port", "0"], stderr=subprocess.PIPE, text=True
        )
        try:
            assert server.stderr is not None
            found = re.search(r"at (http://127\.0\.0\.1:\d+)/", server.stderr.readline())
            if found is None:
                raise SystemExit("serve did not start")
            base = found.group(1)
            pages = [
                ("overview", "/", None),
                ("search", "/search?q=writer+killed", None),
                ("conversation", "/conversations/1#entry-13", None),
                ("document", "/documents/5?as_of=9", None),
                ("log", "/log", None),
                ("tasks", "/tasks", None),
            ]
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=args.chromium, headless=True, args=["--no-sandbox"]
                )
                try:
                    page = browser.new_page(viewport={"width": 1200, "height": 900})
                    for name, path, _ in pages:
                        response = page.goto(base + path)
                        if response is None or response.status != 200:
                            raise SystemExit(f"{path}: {response and response.status}")
                        page.screenshot(path=str(out / f"{name}.png"), full_page=False)
                        print(f"{out / (name + '.png')}: {path}")
                finally:
                    browser.close()
        finally:
            server.terminate()
            server.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
