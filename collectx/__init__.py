"""collectx: topology-aware collective communication for Python.

>>> import collectx
>>> issubclass(collectx.PeerFailure, collectx.CollectXError)
True
"""

from __future__ import annotations

from .errors import *  # noqa: F401,F403  (the public exception tree)
from .errors import __all__ as _error_names

__version__ = "0.1.0"

# Heavier pieces (native library, runtime, planner) load on first use so that `import collectx`
# stays fast and never needs a compiler, a GPU or torch.
_LAZY = {
    "init": ("collectx.runtime", "init"),
    "launch": ("collectx.runtime", "launch"),
    "Communicator": ("collectx.runtime", "Communicator"),
    "build_info": ("collectx._native", "build_info"),
    "cuda_available": ("collectx._native", "cuda_available"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'collectx' has no attribute {name!r}")


__all__ = list(_error_names) + list(_LAZY) + ["__version__"]
