"""What the inference entry points (``translate``, ``generate``, ``synthesize``) share about their inputs: the options
checked before any work, each bad one a one-line :class:`OptionError`, and text lines read as bytes so that invalid
UTF-8 is named by its line number instead of a ``UnicodeDecodeError`` traceback.
"""

from __future__ import annotations

import codecs
import datetime
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ..core.errors import InputError, OptionError, OutputError


def _shown(value: Any) -> str:
    return "null" if value is None else repr(value) if isinstance(value, str) else str(value)


def _missing(cfg: DictConfig, key: str) -> bool:
    try:
        return OmegaConf.is_missing(cfg, key)
    except Exception:  # not a key of this config
        return False


def check(cfg: Any, key: str, ok: Callable[[Any], bool], allowed: str) -> Any:
    """``cfg[key]`` when ``ok(value)`` holds (a wrong type counts as not ok); else an OptionError saying
    ``key=value`` and ``allowed``."""
    if isinstance(cfg, DictConfig) and _missing(cfg, key):  # `???` in the yaml and not given
        raise OptionError(f"{key}= is required: {allowed}")
    value = cfg.get(key)
    try:
        good = bool(ok(value))
    except (TypeError, ValueError):
        good = False
    if not good:
        raise OptionError(f"{key}={_shown(value)} is not allowed: {allowed}")
    return value


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value  # not NaN


def is_seed(value: Any) -> bool:
    """An integer ``torch.Generator.manual_seed`` takes (a larger one overflowed into a traceback)."""
    return is_int(value) and -(1 << 63) <= value < (1 << 64)


def is_device(value: Any) -> bool:
    """A device torch can use here: ``cpu``, or ``cuda``/``cuda:N`` on a machine with that GPU."""
    import torch

    try:
        device = torch.device(str(value))
    except (RuntimeError, ValueError):
        return False
    if device.type == "cuda":
        return torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count()
    return device.type in ("cpu", "mps") and (device.type != "mps" or torch.backends.mps.is_available())


DEVICE_HELP = "cpu, or cuda / cuda:N on a machine with that GPU"


def check_output(key: str, path: str | Path | None, folder: bool = False) -> Path | None:
    """``path`` as a Path when it can be written (an output file, or a ``folder`` of outputs), checked before any
    work so that a long run does not end in a traceback: what exists there must be of the right kind, and the
    nearest existing folder above it must be a folder. None when not given."""
    if path is None or str(path) == "":
        return None
    p = Path(str(path)).expanduser()
    if p.exists() and p.is_dir() != folder:
        raise OptionError(f"{key}={p} is a {'folder' if p.is_dir() else 'file'}; give the path of a "
                          f"{'folder' if folder else 'file'}")
    above = p.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise OptionError(f"{key}={p} cannot be created: {above} is a file, not a folder")
    return p


def write_output(key: str, path: Path, write: Callable[[Path], Any]) -> Any:
    """``write(path)`` after creating its folder; an OSError (disk full, read-only) as one line naming it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return write(path)
    except OSError as e:
        raise OutputError(f"cannot write {key}={path}: {e.strerror or e}") from None


def read_lines(source: str | Path | None, input_errors: str = "strict") -> tuple[list[str], str]:
    """The lines of ``source`` (a file) or of stdin when it is None, and a name for messages ("stdin" or the path).

    Read as bytes and decoded line by line: a byte sequence that is not UTF-8 is an InputError naming its line
    (``input_errors="strict"``), or becomes U+FFFD (``"replace"``). Lines end at ``\\n`` (a ``\\r`` before it is
    dropped), not at the other Unicode line breaks ``str.splitlines`` would split on, so line N is what
    ``sed -n Np`` shows. A UTF-8 byte-order mark at the start is skipped.
    """
    if input_errors not in ("strict", "replace"):
        raise OptionError(f"input_errors={_shown(input_errors)} is not allowed: strict (stop at a line that is "
                          "not UTF-8) or replace (bad bytes become U+FFFD)")
    if source is None:
        name, data = "stdin", sys.stdin.buffer.read()
    else:
        path = Path(source).expanduser()
        if not path.is_file():
            raise InputError(f"input file not found: {path.resolve()}")
        name, data = str(path), path.read_bytes()
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    raw = data.split(b"\n")
    if raw and raw[-1] == b"":
        raw.pop()  # the newline that ends the last line does not start another
    lines = []
    for number, line in enumerate(raw, start=1):
        line = line[:-1] if line.endswith(b"\r") else line
        try:
            lines.append(line.decode("utf-8", errors=input_errors))
        except UnicodeDecodeError as e:
            raise InputError(f"{name} line {number} is not valid UTF-8 (byte 0x{line[e.start]:02x} at column "
                             f"{e.start + 1}); fix the encoding or pass input_errors=replace") from None
    return lines, name


THREADS_HELP = "auto (the cores other processes leave free) or a positive integer"


def is_threads(value: Any) -> bool:
    return value == "auto" or (is_int(value) and value >= 1)


def apply_threads(cfg: Any, log: logging.Logger) -> None:
    """torch's intra-op threads for an inference command, by train.py's rule (:mod:`attnlab.runs.threads`): on a
    busy 2-core machine two threads sampled 2 x 60 tokens in 11 s, one in 0.06 s. Logged at debug level: the
    commands' stderr carries their own lines (a refusal is the one line there)."""
    from ..runs.threads import apply

    log.debug(apply(cfg.get("threads", "auto")).line())


class Progress:
    """One log line (stderr) every ``every_s`` seconds while a long piece of work runs: ``what`` done of ``total``,
    the rate, the time left. Work that ends sooner prints nothing."""

    def __init__(self, total: int, what: str, every_s: float = 10.0, log: logging.Logger | None = None):
        self.total, self.what, self.every_s = total, what, every_s
        self.log = log or logging.getLogger("attnlab")
        self.start = self.last = time.monotonic()

    def update(self, done: int) -> None:
        now = time.monotonic()
        if now - self.last < self.every_s or done >= self.total:
            return
        self.last = now
        rate = done / max(now - self.start, 1e-9)
        left = (self.total - done) / rate if rate > 0 else float("inf")
        shown = str(datetime.timedelta(seconds=round(left))) if left != float("inf") else "?"
        self.log.info(f"{self.what}: {done}/{self.total} ({rate:.3g}/s, ~{shown} left)")
