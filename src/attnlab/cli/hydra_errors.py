"""Hydra's own errors before a job starts (an unknown option or key, ``+key`` on a key that exists, ``~key`` of a
key that does not, a malformed override, an interpolation in ``hydra.run.dir`` that cannot be resolved) as one line
and exit status 2, like every other bad input.

Hydra prints these itself, over several lines (its message, the OmegaConf cause with ``full_key:`` and
``object_type=`` lines, a list of choices, a blank line and "Set the environment variable HYDRA_FULL_ERROR=1 ...")
and exits with 1. :func:`one_line_hydra_errors` runs a ``@hydra.main`` function with Hydra's reporter
(``hydra._internal.utils.run_and_report``, the one place all of them pass through) wrapped: an error of Hydra or
OmegaConf raised before the job began is printed as one line on stderr; an error once the job has started is a bug
(the job reports bad inputs itself): its whole traceback, exit 1; anything else goes to Hydra's own reporter.
``HYDRA_FULL_ERROR=1`` keeps Hydra's full traceback.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from typing import Any


def one_line(error: BaseException) -> str:
    """Hydra's message (and its cause's) on one line: indented detail lines (``full_key: ...``) and the config
    search path dropped, a list of choices after a ``...:`` line joined with commas; an interpolation that cannot
    be resolved named by its key (:func:`attnlab.runs.validate.interpolation_message`)."""
    from omegaconf.errors import InterpolationResolutionError

    if isinstance(error, InterpolationResolutionError):
        from ..runs.validate import interpolation_message

        return interpolation_message(error)
    text = str(error).split("\nConfig search path", 1)[0]
    parts: list[str] = []
    for text in (text, str(error.__cause__ or "")):
        lines = [line for line in text.splitlines() if line.strip()]
        for line in lines:
            stripped = line.strip()
            if stripped.startswith(("full_key:", "object_type=", "reference_type=", "Set the environment variable")):
                continue
            if line.startswith(("\t", "    ")) and parts and parts[-1].endswith((":", ",")):
                parts[-1] += (" " if parts[-1].endswith(":") else " ") + stripped + ","
                continue
            if stripped not in parts:
                parts.append(stripped)
    message = " ".join(p.rstrip(",") for p in parts) or type(error).__name__
    return message


def one_line_hydra_errors(hydra_main: Callable[[], Any], job_started: Callable[[], bool]) -> Any:
    """Call ``hydra_main`` (a ``@hydra.main`` function) with Hydra's pre-job errors reported as one line, exit 2."""
    from hydra._internal import utils as hydra_utils
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    original = getattr(hydra_utils, "run_and_report", None)
    if original is None:  # another Hydra: its own report, and its exit status 1 for a bad command line made 2
        try:
            return hydra_main()
        except SystemExit as e:  # (the exception Hydra printed is the context of its sys.exit(1))
            config_error = isinstance(e.__context__, (HydraException, OmegaConfBaseException))
            if e.code == 1 and not job_started() and config_error:
                raise SystemExit(2) from None
            raise

    def run_and_report(func: Callable[[], Any]) -> Any:
        try:
            return func()
        except Exception as error:
            if job_started() and os.environ.get("HYDRA_FULL_ERROR") != "1":
                # the job reports its bad inputs itself (one line); what reaches here is a bug: its whole traceback,
                # which Hydra's reporter cuts to the last message of an instantiate chain
                traceback.print_exception(error)
                sys.exit(1)
            if (job_started() or os.environ.get("HYDRA_FULL_ERROR") == "1"
                    or not isinstance(error, (HydraException, OmegaConfBaseException))):
                def again(error: Exception = error) -> Any:  # (bound now: Python unbinds the name after except)
                    raise error

                return original(again)
            sys.stderr.write(f"error: {one_line(error)}\n")
            sys.stderr.flush()
            sys.exit(2)

    hydra_utils.run_and_report = run_and_report
    try:
        return hydra_main()
    finally:
        hydra_utils.run_and_report = original
