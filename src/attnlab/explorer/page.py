"""One HTML file: the viewer (template.html, shipped in the package) with the record's JSON inlined."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from ..files.atomic import write_atomic

__all__ = ["page_html", "write_page", "read_payload", "EXPLORER_KEY"]

EXPLORER_KEY = "attention/explorer"  # the W&B key the attention-map callback logs the page under (wandb.Html)
_MARK = "/*__ATTNLAB_DATA__*/null"


def _template() -> str:
    return resources.files(__package__).joinpath("template.html").read_text(encoding="utf-8")


def page_html(payload: dict[str, Any]) -> str:
    """The page for a record's payload. Every ``<`` in the JSON is written ``\\u003c`` (``<`` appears only inside
    its strings): no token text can close the script element or put the HTML parser into a comment state."""
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")
    html = _template()
    if _MARK not in html:
        raise RuntimeError("attnlab/explorer/template.html lost its data marker")
    return html.replace(_MARK, data, 1)


def write_page(payload: dict[str, Any], path: str | Path) -> Path:
    """Write the page atomically (a reader, or W&B, never sees half a file); returns its path."""
    return write_atomic(path, page_html(payload), durable=False)


def read_payload(path: str | Path) -> dict[str, Any]:
    """The JSON a page holds (ValueError when the file is not such a page)."""
    html = Path(path).read_text(encoding="utf-8")
    start = html.find('<script id="attnlab-data" type="application/json">')
    end = html.find("</script>", start)
    if start < 0 or end < 0:
        raise ValueError(f"{path} is not an attention explorer page")
    data = json.loads(html[html.index(">", start) + 1:end])
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds no explorer data")
    return data
