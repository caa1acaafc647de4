"""A bug planted in one function of the project, for the test that a bug keeps its traceback.

Put this folder on ``PYTHONPATH`` and set ``ATTNLAB_PLANT_BUG`` to ``module:qualname:ExceptionName`` (e.g.
``attnlab.tasks.translation:TranslationTask.__init__:NameError``): the function is replaced, before the script
runs, by one that raises that built-in exception. Modules that import the function by name later get the
replacement. Without the variable nothing changes.
"""

# preloaded_python: fork-safe
# (it imports the project's module and replaces one attribute: a command forked from the preloaded interpreter
# imports this before its script runs, as a new interpreter's site module would)
from __future__ import annotations

import builtins
import functools
import importlib
import os

_SPEC = os.environ.get("ATTNLAB_PLANT_BUG")


def _plant(spec: str) -> None:
    module_name, qualname, error_name = spec.split(":")
    owner = importlib.import_module(module_name)
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    original = getattr(owner, name)
    error = getattr(builtins, error_name)

    @functools.wraps(original)
    def planted(*args, **kwargs):
        raise error(f"planted bug in {qualname}")

    setattr(owner, name, planted)


if _SPEC:
    _plant(_SPEC)
