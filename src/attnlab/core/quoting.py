"""Paths in commands: as a Hydra override value (``hydra.run.dir=<path>`` that a DDP rank re-parses) and as a shell
word (every command printed for the user to paste: ``resume=...``, ``ckpt_path=...``, ``wandb sync ...``).

Hydra's override grammar reads ``,`` as a sweep list, ``(`` as a function call, ``[``/``{`` as a list or dict,
``${`` as an interpolation and a space-separated tail as an error; a quoted value is a plain string, in which a quote,
a backslash before a quote (or at the end) and ``${`` are escaped. :func:`hydra_value` quotes exactly when needed, so
an ordinary path stays as it is; :func:`shell_override` adds the shell's quoting on top.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

_PLAIN = re.compile(r"[A-Za-z0-9_./@:+-]+")  # parses back to the same string (unless it reads as a number/bool)


def hydra_value(value: str | Path) -> str:
    """``value`` written so that Hydra's override parser returns exactly this string."""
    text = str(value)
    if _PLAIN.fullmatch(text) and not _reads_as_other_type(text):
        return text
    out = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            # backslashes are literal unless they precede a quote or end the string: double the whole run then
            run = len(text[i:]) - len(text[i:].lstrip("\\"))
            nxt = text[i + run : i + run + 2]
            out.append("\\" * (run * 2 if nxt in ("", "'") or nxt.startswith("'") or nxt == "${" else run))
            i += run
            continue
        if c == "'":
            out.append("\\'")
        elif text.startswith("${", i):
            out.append("\\$")
        else:
            out.append(c)
        i += 1
    return "'" + "".join(out) + "'"


def _reads_as_other_type(text: str) -> bool:
    low = text.lower()
    if low in ("true", "false", "null", "nan", "inf", "+inf", "-inf"):
        return True
    try:
        float(text.replace("_", ""))
        return True
    except ValueError:
        return False


def shell_override(key: str, value: str | Path) -> str:
    """``key=value`` to paste into a shell: Hydra's quoting, then the shell's (a plain path stays plain)."""
    return shlex.quote(f"{key}={hydra_value(value)}")


def shell_path(path: str | Path) -> str:
    """A path as one shell word."""
    return shlex.quote(str(path))
