"""What the browser tests share: signing in as one of the test people (password "pw")."""

from __future__ import annotations


def log_in(page, live_server, who: str, next_path: str = "") -> None:
    page.goto(f"{live_server.url}/accounts/login/" + (f"?next={next_path}" if next_path else ""))
    page.fill("#id_username", who)
    page.fill("#id_password", "pw")
    page.click("button[type=submit]")
