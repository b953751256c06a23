"""All of collectx's knobs, read once from ``COLLECTX_*`` variables into one frozen object.

Library code never reads ``os.environ`` directly for a ``COLLECTX_*`` setting: it takes a
:class:`Config` (usually :func:`get_config`) so a run can be reproduced by passing the same values.

>>> cfg = Config.from_env({"COLLECTX_TIMEOUT": "5", "COLLECTX_ALGO": "ring"})
>>> cfg.timeout_s, cfg.algo
(5.0, 'ring')
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Mapping

from .errors import ConfigError

_LOG_LEVELS = ("", "WARN", "INFO", "TRACE")
_CACHE_OFF = ("", "off", "0", "none")  # COLLECTX_CACHE_DIR values that keep no plan cache


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
    debug: str = ""              # COLLECTX_DEBUG: "", WARN, INFO or TRACE
    algo: str | None = None      # COLLECTX_ALGO: force one planner algorithm by name
    topo_file: str | None = None       # COLLECTX_TOPO_FILE: use this topology instead of probing
    topo_dump_file: str | None = None  # COLLECTX_TOPO_DUMP_FILE: write what was probed here
    plan_file: str | None = None       # COLLECTX_PLAN_FILE: run this schedule instead of planning
    plan_dump_file: str | None = None  # COLLECTX_PLAN_DUMP_FILE: write each schedule used here
    timeout_s: float = 300.0     # COLLECTX_TIMEOUT: seconds before a collective raises Timeout
    window_bytes: int = 64 << 20  # COLLECTX_WINDOW_BYTES: shared window per rank (tiles beyond)
    tile_bytes: int = 2 << 20    # COLLECTX_TILE_BYTES: one tile's staging slots (cache-sized)
    hosts: str | None = None     # COLLECTX_HOSTS: split local ranks into pseudo-hosts ("2,2")
    native_lib: str | None = None  # COLLECTX_NATIVE_LIB: load this libcollectx instead of searching
    cma: bool = True             # COLLECTX_CMA=0: peers read large buffers from the window, never
                                 # across processes (process_vm_readv)
    cache_dir: str | None = None  # COLLECTX_CACHE_DIR: the plan cache (runtime/plan_cache.py);
                                  # unset: $XDG_CACHE_HOME/collectx or ~/.cache/collectx; "" or
                                  # "off": none (a Config built in code has none)
    cuda_channels: int | None = None  # COLLECTX_CUDA_CHANNELS: blocks per lane of a CUDA call
                                      # (the same on every rank); unset: from size and SMs

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Config":
        env = os.environ if env is None else env
        get = lambda k: (env.get(k) or "").strip() or None  # noqa: E731
        debug = (get("COLLECTX_DEBUG") or "").upper()
        if debug not in _LOG_LEVELS:
            raise ConfigError(f"COLLECTX_DEBUG={debug!r}: expected one of WARN, INFO, TRACE")
        return cls(
            debug=debug,
            algo=get("COLLECTX_ALGO"),
            topo_file=get("COLLECTX_TOPO_FILE"),
            topo_dump_file=get("COLLECTX_TOPO_DUMP_FILE"),
            plan_file=get("COLLECTX_PLAN_FILE"),
            plan_dump_file=get("COLLECTX_PLAN_DUMP_FILE"),
            timeout_s=_positive(get, "COLLECTX_TIMEOUT", 300.0, float),
            window_bytes=_positive(get, "COLLECTX_WINDOW_BYTES", 64 << 20, int),
            tile_bytes=_positive(get, "COLLECTX_TILE_BYTES", 2 << 20, int),
            hosts=get("COLLECTX_HOSTS"),
            native_lib=get("COLLECTX_NATIVE_LIB"),
            cma=_flag(get, "COLLECTX_CMA", True),
            cache_dir=_cache_dir(env),
            cuda_channels=(_positive(get, "COLLECTX_CUDA_CHANNELS", 1, int)
                           if get("COLLECTX_CUDA_CHANNELS") else None),
        )


def _positive(get, name, default, kind):
    raw = get(name)
    if raw is None:
        return default
    try:
        value = kind(raw)
    except ValueError:
        value = -1
    if value <= 0:
        raise ConfigError(f"{name}={raw!r}: expected a positive {kind.__name__}; unset it to use "
                          f"the default {default}")
    return value


def _cache_dir(env: Mapping[str, str]) -> str | None:
    """COLLECTX_CACHE_DIR, or the XDG default when it is unset; None when it turns the cache off.

    >>> _cache_dir({"HOME": "/home/me"}), _cache_dir({"XDG_CACHE_HOME": "/c", "HOME": "/h"})
    ('/home/me/.cache/collectx', '/c/collectx')
    >>> _cache_dir({"COLLECTX_CACHE_DIR": "/tmp/plans"}), _cache_dir({"COLLECTX_CACHE_DIR": "off"})
    ('/tmp/plans', None)
    """
    raw = env.get("COLLECTX_CACHE_DIR")
    if raw is not None:
        raw = raw.strip()
        return None if raw.lower() in _CACHE_OFF else os.path.expanduser(raw)
    xdg = (env.get("XDG_CACHE_HOME") or "").strip()
    if not os.path.isabs(xdg):  # the XDG spec ignores a relative path
        home = (env.get("HOME") or "").strip() or os.path.expanduser("~")
        xdg = os.path.join(home, ".cache")
    return os.path.join(xdg, "collectx")


def _flag(get, name, default: bool) -> bool:
    raw = get(name)
    if raw is None:
        return default
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={raw!r}: expected 0 or 1; unset it to use the default "
                      f"{int(default)}")


@functools.lru_cache(maxsize=1)
def get_config() -> Config:
    """The process-wide configuration, read from the environment on first use."""
    return Config.from_env()
