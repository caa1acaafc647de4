"""Split attnlab/checkpoints.py: the file format's read (-> checkpoint_read.py) and the loading of a task (stays)."""
import re, sys
from pathlib import Path
ROOT = Path(sys.argv[1])
p = ROOT / "src/attnlab/checkpoints.py"
s = p.read_text()
def block(name):
    m = re.search(rf"^(def|class) {re.escape(name)}\b", s, re.M)
    start = m.start()
    # include a preceding decorator line
    prev = s.rfind("\n", 0, start - 1)
    if s[prev + 1:start].startswith("@"):
        start = prev + 1
    nxt = re.search(r"^(def |class |@)", s[m.end():], re.M)
    end = m.end() + nxt.start() if nxt else len(s)
    return start, end
LOAD = ["_family", "_task_class", "build_task", "load_task", "check_tokenizer", "for_training"]
spans = sorted(block(n) for n in LOAD)
load_text = "".join(s[a:b] for a, b in spans)
read_text = s
for a, b in reversed(spans):
    read_text = read_text[:a] + read_text[b:]
doc_end = read_text.index('"""', 3) + 3
header_imports = read_text[doc_end:read_text.index("# Types the safe unpickler")]
read_doc = '''"""Read a checkpoint without ever running code from it: the one read (:func:`read_trusted`) every entry point
and train.py's plan use, and the checks of what a file may name.

''' + read_text[3:doc_end].lstrip()
read_text = read_doc.replace("""Read checkpoints written by train.py without ever running code from them, and load a task from one, refusing a
file of another model family with one line.

""", "") + read_text[doc_end:]
(ROOT / "src/attnlab/checkpoint_read.py").write_text(read_text.rstrip() + "\n")
load_doc = '''"""Load a task from a checkpoint (:func:`load_task`, the one loader of the inference entry points) and find the
checkpoint a training run continues from (:func:`for_training`): each from the one read of the file
(:mod:`attnlab.checkpoint_read`), refusing a file of another model family with one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import hydra

from .checkpoint_read import (
    LIGHTNING_CKPT_NAMES,
    TrustedCheckpoint,
    _model_config,
    check_callback_paths,
    read_trusted,
)
from .errors import CheckpointError


'''
p.write_text(load_doc + load_text.rstrip() + "\n")
t = (ROOT / "src/attnlab/checkpoint_read.py").read_text()
t = t.replace("from collections.abc import Mapping\n", "").replace("import hydra\n", "")
(ROOT / "src/attnlab/checkpoint_read.py").write_text(t)
