"""Each inference entry point reads its checkpoint file once: an audit hook counts the opens of that one path while
the entry point runs in this process, as a user's command line gives it (Hydra included). train.py's ``resume=``
and ``ckpt_path=`` checks share one read too (Lightning's restore is the second): measured by the slow resume
tests' runs, not repeated here."""

from __future__ import annotations

import importlib
import os
import sys
from contextlib import contextmanager

import pytest
from test_safe_checkpoints import FIXTURES, LEGACY_LM, LEGACY_MT

_counted = {"path": None, "opens": 0}


def _count_opens(event: str, args: tuple) -> None:
    if event == "open" and _counted["path"] and args and isinstance(args[0], (str, bytes, os.PathLike)):
        try:
            if os.path.realpath(os.fsdecode(args[0])) == _counted["path"]:
                _counted["opens"] += 1
        except (TypeError, ValueError):
            pass


sys.addaudithook(_count_opens)  # hooks cannot be removed: this one counts only inside opens_of()


@contextmanager
def opens_of(path):
    _counted.update(path=os.path.realpath(path), opens=0)
    try:
        yield _counted
    finally:
        _counted["path"] = None


ENTRY_POINTS = {  # module, checkpoint, the rest of its command line
    "translate": ("attnlab.cli.translate", LEGACY_MT, ["beam_size=2", "input={tmp}/in.txt", "output={tmp}/out.txt"]),
    "generate": ("attnlab.cli.generate", LEGACY_LM, ["prompt=def", "max_new_tokens=2", "num_samples=1"]),
    "synthesize": ("attnlab.cli.synthesize", FIXTURES / "legacy_tts.ckpt", ["text=one", "griffin_lim_iters=1"]),
    "explore": ("attnlab.cli.explore", LEGACY_LM, ["text=def", "out={tmp}/explorer.html"]),
}


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_an_entry_point_reads_its_checkpoint_once(name, tmp_path, monkeypatch, cache_dir):
    module, ckpt, args = ENTRY_POINTS[name]
    (tmp_path / "in.txt").write_text("twenty-one\n")
    monkeypatch.setenv("ATTNLAB_CACHE", cache_dir)
    argv = [name, f"ckpt={ckpt}", f"hydra.run.dir={tmp_path / 'run'}", *(a.format(tmp=tmp_path) for a in args)]
    monkeypatch.setattr(sys, "argv", argv)
    with opens_of(ckpt) as counted:
        try:
            importlib.import_module(module)._main()
        except SystemExit as e:
            assert not e.code, f"{name} exited with {e.code}"
    assert counted["opens"] == 1, f"{name} opened {ckpt.name} {counted['opens']} times"
