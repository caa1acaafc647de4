"""An Optuna search space written as Hydra sweep overrides, the form ``conf/hparams_search/*.yaml`` uses:

    params:
      model.optimizer.lr: tag(log, interval(1e-4, 1e-2))   # a float, drawn on a log scale
      model.net.d_model: choice(192, 288, 384)             # one of these (any values: numbers, strings)
      norm: pre,rms                                         # the same as choice(pre, rms)
      model.net.n_layers: range(2, 6)                       # an int from 2 to 5 (the stop is excluded, as in Python)

The command line may add to it (``model.net.dropout=interval(0,0.3)``); an override without a sweep is the same in
every trial. A bad entry is one line naming it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from ..core.errors import ConfigError


def parse(params: Mapping[str, Any] | None, arguments: Iterable[str]) -> tuple[dict[str, Any], list[str]]:
    """``(space, fixed)``: each swept key's Optuna distribution (the config's ``params``, then the command line's
    sweeps, which win), and the command line's other overrides as typed."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    parser = OverridesParser.create()
    space: dict[str, Any] = {}
    fixed: list[str] = []
    typed = [f"{k}={v}" for k, v in (params or {}).items()]
    for origin, items in (("hparams_search params", typed), ("command line", list(arguments))):
        for item in items:
            try:
                (override,) = parser.parse_overrides([item])
            except (HydraException, OmegaConfBaseException) as e:
                raise ConfigError(f"{origin}: {item}: not a Hydra override ({str(e).splitlines()[0]})") from None
            key = override.get_key_element()
            if override.is_sweep_override():
                space[key] = distribution(key, override.value())
                fixed = [f for f in fixed if f.split("=", 1)[0].lstrip("+~") != key]
            else:
                space.pop(key, None)
                fixed.append(item)
    return space, fixed


def distribution(key: str, sweep: Any):
    """The Optuna distribution of one Hydra sweep value."""
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    tags = set(getattr(sweep, "tags", ()) or ())
    if tags - {"log"}:
        raise ConfigError(f"{key}: tag {', '.join(sorted(tags - {'log'}))} means nothing to the search (log does)")
    if isinstance(sweep, ChoiceSweep):
        if tags:
            raise ConfigError(f"{key}: a choice has no scale; tag(log, ...) goes with interval() or range()")
        values = list(sweep.list)
        if not values or any(isinstance(v, (list, dict)) for v in values):
            raise ConfigError(f"{key}: choice() needs one or more plain values (numbers, strings)")
        return CategoricalDistribution(values)
    if isinstance(sweep, IntervalSweep):
        low, high = sweep.start, sweep.end
        if not low < high:
            raise ConfigError(f"{key}: interval({low}, {high}) is empty; give interval(low, high) with low < high")
        if "log" in tags and low <= 0:
            raise ConfigError(f"{key}: a log scale needs interval() above 0, got {low}")
        if isinstance(low, int) and isinstance(high, int):
            return IntDistribution(low, high, log="log" in tags)
        return FloatDistribution(float(low), float(high), log="log" in tags)
    if isinstance(sweep, RangeSweep):
        start, stop, step = sweep.start, sweep.stop, sweep.step
        count = math.ceil((stop - start) / step - 1e-9) if step > 0 else 0  # Python's range: the stop excluded
        if count < 1:
            raise ConfigError(f"{key}: range({start}, {stop}, {step}) holds no value")
        last = start + (count - 1) * step
        if all(isinstance(v, int) for v in (start, stop, step)):
            if "log" in tags and step != 1:
                raise ConfigError(f"{key}: a log scale takes range() with step 1")
            return IntDistribution(start, last, step=step, log="log" in tags)
        if "log" in tags:
            raise ConfigError(f"{key}: a log scale takes interval() for floats")
        return FloatDistribution(float(start), float(last), step=float(step))
    raise ConfigError(f"{key}: {type(sweep).__name__} is not a search space (interval, range or choice)")


def override(key: str, value: Any) -> str:
    """``key=value`` for a drawn value, quoted for Hydra where a string needs it."""
    from ..core.quoting import hydra_value

    if isinstance(value, bool) or value is None:
        return f"{key}={str(value).lower() if value is not None else 'null'}"
    if isinstance(value, (int, float)):
        return f"{key}={value!r}"
    return f"{key}={hydra_value(str(value))}"
