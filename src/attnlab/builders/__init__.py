"""The parts a config group option names, built as ``python train.py <group>=<option>`` builds them, for models
made in Python (notebooks, tests): ``CausalLM(..., attn=load_part("attn", "gqa", kv_heads=4))``.

The one place below the tasks that turns names into classes (Hydra's instantiate); the modules and models take
built parts only (:mod:`attnlab.modules.parts`).
"""

from .parts import load_part, part_config

__all__ = ["load_part", "part_config"]
