"""``python -m attnlab.families``: the model table (one row per registered family), in Markdown."""

from __future__ import annotations

from . import families


def table() -> str:
    rows = ["| `model=` | what | data | block groups | served by |", "|---|---|---|---|---|"]
    for f in families():
        names = ", ".join(f"`{m}`" for m in f.models)
        groups = ", ".join(f.groups) or "none"
        rows.append(f"| {names} | {f.description} | {f.data} | {groups} | `{f.serves}` |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
