"""Refuse a model that cannot fit before it is built: ``model.net.d_model=1000000`` asked torch for terabytes and
ended in an allocation traceback (or the kernel's OOM killer) after Lightning, the run folder and the W&B run were set
up. The net is built on PyTorch's ``meta`` device (shapes only, no memory), its parameters counted, and training
needs about four float32 copies of them: weights, gradients and AdamW's two moments. Activations come on top; this
check only refuses what can never fit.
"""

from __future__ import annotations

import os
from typing import Any

from omegaconf import DictConfig, OmegaConf

BYTES_PER_PARAMETER = 4 * 4  # float32 weights + gradients + AdamW exp_avg + exp_avg_sq


# layer counts above this are not built even on the meta device (a module object per layer: n_layers=10**8 took
# minutes and gigabytes): the count is extrapolated from nets of two and three layers (parameters are affine in each)
BUILT_UP_TO_LAYERS = 64


def count_parameters(net_cfg: Any) -> int | None:
    """Parameters of the net a ``model.net`` config builds (see :func:`_count_built`); a net of very many layers is
    counted from small ones of the same widths, without building it."""
    cfg = OmegaConf.to_container(net_cfg, resolve=True) if isinstance(net_cfg, DictConfig) else dict(net_cfg)
    deep = {k: v for k, v in cfg.items() if k.endswith("layers") and isinstance(v, int) and not isinstance(v, bool)}
    if not deep or max(deep.values()) <= BUILT_UP_TO_LAYERS:
        return _count_built(cfg)
    small = {k: 2 for k in deep}  # (not 1: a stack's first and last layers may differ, as the TTS postnet's do)
    base = _count_built({**cfg, **small})
    if base is None:
        return None
    total = base
    for key, n in deep.items():
        more = _count_built({**cfg, **small, key: 3})
        if more is None:
            return None
        total += (more - base) * (n - 2)
    return total


def _count_built(net_cfg: Any) -> int | None:
    """Parameters of the net a ``model.net`` config builds, counted on the meta device; None if it cannot be built
    there (the real build then reports what is wrong); a part's own refusal of its settings is raised."""
    import hydra
    import torch

    cfg = OmegaConf.to_container(net_cfg, resolve=True) if isinstance(net_cfg, DictConfig) else net_cfg
    from ..core.errors import find_user_error

    try:
        with torch.device("meta"):
            net = hydra.utils.instantiate(cfg, _convert_="all")
        return sum(p.numel() for p in net.parameters())
    except Exception as e:  # noqa: BLE001
        # a part that refuses its settings (pos=rotary on the ViT's 2-D grid) says so here, before Lightning starts,
        # rather than after the config tree and Lightning's start-up; anything else is the real build's to report
        refused = find_user_error(e)
        if refused is not None:
            raise refused from None
        return None


def available_bytes(accelerator: str | None) -> tuple[int, str] | None:
    """(bytes, where) the parameters would live in: a CUDA device's memory, else the memory the OS has free."""
    if accelerator in ("gpu", "cuda"):
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).total_memory, "GPU memory"
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if ":" in line}
        return info.get("MemAvailable", info.get("MemFree", 0)), "memory available"
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "memory available"
    except (ValueError, OSError, AttributeError):
        return None


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} PiB"


def net_memory_problem(net: Any, accelerator: str | None, bytes_per_parameter: int = BYTES_PER_PARAMETER,
                       what: str = "training needs", to_fix: str = "make the model smaller (model.net.d_model, "
                       "n_layers, data.vocab_size)") -> str | None:
    """One phrase if the net a ``model.net`` config builds needs more memory than there is (``bytes_per_parameter``
    of each parameter: 16 to train with AdamW, 4 to hold float32 weights), else None; nothing is allocated."""
    params = count_parameters(net)
    if params is None:
        return None
    room = available_bytes(accelerator)
    need = params * bytes_per_parameter
    if room is None or need <= room[0]:
        return None
    return (f"model.net has {params:.3g} parameters: {what} {_size(need)}, more than the {_size(room[0])} of "
            f"{room[1]}; {to_fix}")


def memory_problem(cfg: DictConfig, resolved_net: dict | None = None) -> str | None:
    """One phrase if training the configured net needs more memory than there is, else None. ``resolved_net``:
    ``model.net`` already resolved (else it is resolved here)."""
    net = OmegaConf.select(cfg, "model.net")
    if not isinstance(net, DictConfig) or "_target_" not in net:
        return None
    return net_memory_problem(net if resolved_net is None else resolved_net,
                              str(OmegaConf.select(cfg, "trainer.accelerator", default="cpu")),
                              what="training needs for its float32 weights, gradients and AdamW state")
