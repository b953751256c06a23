"""``import collectx.torch`` registers collectx as a torch.distributed backend named "collectx".

>>> import collectx.torch
>>> import torch.distributed as dist
>>> dist.is_backend_available("collectx")
True

Then ``torch.distributed.init_process_group("collectx")`` works under torchrun (env://), with
``init_method="file://..."`` or ``"tcp://..."``, and ``new_group(backend="collectx")``. torch is an
optional dependency (``pip install collectx[torch]``); plain ``import collectx`` never imports it.
"""

from __future__ import annotations

from .integrations.torch_backend import (BACKEND_NAME, CollectxProcessGroup,  # noqa: F401
                                         create_process_group, register)

register()

__all__ = ["BACKEND_NAME", "CollectxProcessGroup", "create_process_group", "register"]
