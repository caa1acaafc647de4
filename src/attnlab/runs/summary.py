"""The last lines of a finished run: where its folder, last checkpoint and attention explorer are, and the next
commands with the paths filled in, ready to paste (each path quoted for Hydra and the shell:
:func:`attnlab.core.quoting.shell_override`). What serves a checkpoint is the family's (:mod:`attnlab.families`:
``serves``, ``explorer_input``)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..families import Family, for_config
from ..core.paths import IN_CHECKOUT, PACKAGE_DIR
from ..core.quoting import shell_override, shell_path
from .sweep import setting_overrides

NUMBERS_SOURCE = "two thousand and twenty-six"  # data=numbers: English number words
# what each explorer input is given in the example command (families' explorer_input)
EXPLORE_INPUT = {"text": ("text", "The for statement"), "speech": ("text", "twenty one"),
                 "ids": ("text", "3 17 5 9"), "image": ("image", "YOUR_IMAGE.png")}


def text_override(key: str, text: str) -> str:
    """``key=text`` for the shell where Hydra must read ``text`` as one string: ``prompt='"The for statement"'``
    (Hydra's double quotes inside the shell's single quotes), else :func:`shell_override`'s quoting."""
    if text and not set(text) & set("'\"\\$"):
        return f"{key}='\"{text}\"'"
    return shell_override(key, text)


def shown(path: Path, cwd: Path | None = None) -> Path:
    """``path`` relative to the current directory when it lies under it (shorter to read and paste)."""
    cwd = Path.cwd() if cwd is None else cwd
    try:
        return path.resolve().relative_to(cwd.resolve())
    except ValueError:
        return path


def entry(name: str, cwd: Path | None = None) -> str:
    """How to start an entry point from here: ``python translate.py`` in the checkout's root, else the module."""
    cwd = Path.cwd() if cwd is None else cwd
    script = cwd / f"{name}.py"
    if IN_CHECKOUT and script.is_file() and script.resolve() == (PACKAGE_DIR.parents[1] / f"{name}.py").resolve():
        return f"python {name}.py"
    return f"python -m attnlab.{name}"


def _get(cfg: Any, dotted: str) -> Any:
    node = cfg
    for part in dotted.split("."):
        node = node.get(part) if hasattr(node, "get") else None
        if node is None:
            return None
    return node


def serve_commands(family: Family | None, ckpt: Path, cfg: Any, overrides: Sequence[str],
                   cwd: Path | None = None) -> list[tuple[str, str]]:
    """(label, command) of what to do next with ``ckpt``: the family's own entry point, then the explorer."""
    if family is None:
        return []
    ck = shell_override("ckpt", ckpt)
    serves = family.serves.split()[0].removesuffix(".py")
    out: list[tuple[str, str]] = []
    if serves == "translate":
        source = NUMBERS_SOURCE if _get(cfg, "data.source") == "numbers" else "a sentence in the source language"
        out.append(("translate", f"echo {shlex.quote(source)} | {entry('translate', cwd)} {ck}"))
    elif serves == "generate":
        out.append(("generate", f"{entry('generate', cwd)} {ck} {text_override('prompt', 'The for statement')}"))
    elif serves == "synthesize":
        out.append(("synthesize", f"{entry('synthesize', cwd)} {ck} {text_override('text', 'twenty one')}"))
    elif serves == "train":  # a test run of the checkpoint: the same setting (model, data) as this run
        setting = " ".join(shlex.quote(o) for o in setting_overrides(overrides, as_typed=True)
                           if not o.lstrip("+").startswith(("train=", "test=")))
        out.append(("test", " ".join(filter(None, [entry("train", cwd), setting,
                                                    shell_override("ckpt_path", ckpt), "train=false"]))))
    if family.explorer_input == "translation":
        source = NUMBERS_SOURCE if _get(cfg, "data.source") == "numbers" else "a sentence in the source language"
        out.append(("explore", f"python -m attnlab.explore {ck} {text_override('text', source)}"))
    elif family.explorer_input in EXPLORE_INPUT:
        key, value = EXPLORE_INPUT[family.explorer_input]
        arg = f"image={value}" if key == "image" else text_override(key, value)
        out.append(("explore", f"python -m attnlab.explore {ck} {arg}"))
    return out


def summary_lines(cfg: Any, run_dir: Path, overrides: Sequence[str] = (), cwd: Path | None = None) -> list[str]:
    """The lines that end a finished run (module docstring)."""
    try:
        return _summary_lines(cfg, Path(run_dir), overrides, cwd)
    except Exception as e:  # noqa: BLE001 - the run is done and its results written: never fail it here
        return ["finished:", f"  run folder: {shell_path(run_dir)} ({type(e).__name__} listing the rest)"]


def _summary_lines(cfg: Any, run_dir: Path, overrides: Sequence[str], cwd: Path | None) -> list[str]:
    lines = ["finished:"]
    ckpt_dir = _get(cfg, "callbacks.model_checkpoint.dirpath")
    ckpt = Path(str(ckpt_dir)) / "last.ckpt" if ckpt_dir else run_dir / "checkpoints" / "last.ckpt"
    page = _get(cfg, "callbacks.attention_maps.explorer_path")
    page = Path(str(page)) if page else run_dir / "attention" / "explorer.html"
    rows: list[tuple[str, str]] = [("run folder", shell_path(shown(run_dir, cwd)))]
    if ckpt.is_file():
        rows.append(("last checkpoint", shell_path(shown(ckpt, cwd))))
    if page.is_file():
        rows.append(("attention explorer", f"{shell_path(shown(page, cwd))} (open it in a browser)"))
    if ckpt.is_file():
        rows += serve_commands(for_config(cfg), shown(ckpt, cwd), cfg, overrides, cwd)
    width = max((len(label) for label, _ in rows), default=0) + 1
    lines += [f"  {label + ':':<{width}} {text}" for label, text in rows]
    return lines

