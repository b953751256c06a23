"""Which ranks share a host: host ids, local ranks, and COLLECTX_HOSTS pseudo-hosts.

Real hosts are told apart by host name, exchanged over the engine (no extra rendezvous);
``COLLECTX_HOSTS="2,2"`` instead splits the ranks into pseudo-hosts of consecutive ranks (ranks
0-1 on pseudo-host 0, ranks 2-3 on pseudo-host 1), so one machine can test multi-host code.

>>> hosts_from_spec("2,2", 4)
[0, 0, 1, 1]
>>> layout_of([0, 0, 1, 1], rank=3)
HostLayout(host=1, local_rank=1, local_size=2, hosts=((0, 1), (2, 3)))
"""

from __future__ import annotations

import dataclasses
import socket

from ...errors import ConfigError


@dataclasses.dataclass(frozen=True, slots=True)
class HostLayout:
    """This rank's place: its host, its index there, and every host's ranks (rank order)."""

    host: int
    local_rank: int
    local_size: int
    hosts: tuple[tuple[int, ...], ...]

    @property
    def regular(self) -> bool:
        """Every host holds the same number of consecutive ranks (rank = host * L + local)."""
        L = len(self.hosts[0])
        return all(h == tuple(range(k * L, (k + 1) * L)) for k, h in enumerate(self.hosts))

    def rail(self) -> tuple[int, ...]:
        """The ranks with this rank's local index on every host (its inter-host group)."""
        return tuple(h[self.local_rank] for h in self.hosts)


def hosts_from_spec(spec: str, size: int) -> list[int]:
    """Host id of each rank for a ``COLLECTX_HOSTS`` value such as ``"2,2"``."""
    try:
        counts = [int(c) for c in spec.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or sum(counts) != size:
        raise ConfigError(f"COLLECTX_HOSTS={spec!r} with {size} ranks: expected positive rank "
                          f"counts per pseudo-host, comma separated, summing to {size} "
                          f"(e.g. \"{size // 2},{size - size // 2}\")")
    return [h for h, c in enumerate(counts) for _ in range(c)]


def layout_of(host_of: list[int], rank: int) -> HostLayout:
    """The :class:`HostLayout` of ``rank`` given every rank's host id."""
    order: dict[int, list[int]] = {}
    for r, h in enumerate(host_of):
        order.setdefault(h, []).append(r)
    hosts = tuple(tuple(v) for v in order.values())
    host = next(k for k, h in enumerate(hosts) if rank in h)
    return HostLayout(host, hosts[host].index(rank), len(hosts[host]), hosts)


def discover(engine, spec: str | None) -> HostLayout:
    """This rank's layout: from ``spec`` (COLLECTX_HOSTS) or the host names of all ranks."""
    if spec:
        return layout_of(hosts_from_spec(spec, engine.size), engine.rank)
    names = engine.exchange(socket.gethostname())
    ids = {n: i for i, n in enumerate(dict.fromkeys(names))}
    return layout_of([ids[n] for n in names], engine.rank)
