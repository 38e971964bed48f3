"""Reading a worker's /metrics and /healthz."""

from __future__ import annotations

import re
import urllib.error
import urllib.request


def get(port: int, path: str) -> tuple[int, str]:
    """(status, body) of GET ``path``; (0, "") while nothing listens yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return 0, ""


def sample(body: str, name: str, **labels: str) -> float | None:
    """The value of series ``name{labels}`` in a text exposition (None: absent)."""
    for line in body.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            return float(m.group(3))
    return None
