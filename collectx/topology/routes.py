"""Which links a transfer between two nodes crosses: the paths stage every consumer of routes
shares (the planner prices tree edges by them, the simulator runs flows over them), computed
once per topology content.

A remote transfer uses the direct link between two nodes if there is one, else the widest route
(fewest hops among equally wide ones; :func:`collectx.topology.paths.widest_path`, which also
knows which GPUs may relay). A rank-local
copy uses the node's own memory, a resource named ``("local", node)`` whose bandwidth is the
node's ``mem_bw_gbps`` attribute, else a default by device: a GPU device-to-device copy reads
and writes HBM, so about half of V100/A100 peak (~900-2000 GB/s) -> 1000 GB/s; one CPU core
copying memory gets about 10 GB/s.

A rank's ``host`` buffer lives on its *host node* (:meth:`Routes.host_of`): the CPU its PCIe
path reaches, so staging a chunk there costs PCIe up to that CPU and, for a reader on the other
socket, the inter-socket link too. A rank without a CPU in the graph (CPU ranks, toy fabrics) is
its own host node: its host buffer is local memory.
"""

from __future__ import annotations

import networkx as nx

from ..errors import TopologyError
from .model import DEFAULT_LATENCY_US, GPU_LINK_TYPES

LOCAL_BW_GBPS = {"gpu": 1000.0, "cpu": 10.0}
SWITCH_KINDS = ("nvswitch",)
_FALLBACK_LATENCY_US = 1.0

_CACHE: dict = {}
_CACHE_LIMIT = 32


class Routes:
    """Resource table (directed links plus per-node local memory) and a route cache.

    ``capacity[i]`` is in bytes per microsecond; ``names[i]`` is ``(u, v)`` for a link or
    ``("local", node)`` for a node's memory.
    """

    def __init__(self, topo: nx.DiGraph, local_bw_gbps: float | None):
        self.topo = topo
        self.local_bw_gbps = local_bw_gbps
        self.capacity: list[float] = []
        self.names: list[tuple] = []
        self._index: dict[tuple, int] = {}
        self._routes: dict[tuple, tuple[tuple[int, ...], float]] = {}
        self._parts: dict | None = None
        self.attached: dict = {}   # state users keep with the routes (the simulator's shares)
        for u, v, bw in topo.edges(data="bw_gbps"):
            self._resource((u, v), bw)
        for node in topo.nodes:  # every resource exists up front: the flow loop sizes on them
            self._resource(("local", node), self._local_bw(node))
        self.folded: dict[int, tuple[tuple[int, float], ...]] = {}
        self._fold: dict[int, int] = {}
        for group in twin_fabrics(topo):
            if self._all_striped(group):
                self._fold_fabric(group)

    def _resource(self, key: tuple, bw_gbps: float) -> int:
        if not isinstance(bw_gbps, (int, float)) or not bw_gbps > 0:
            raise TopologyError(f"{key[0]}->{key[1]} has bw_gbps={bw_gbps!r}; expected a "
                                "positive GB/s per direction on every link (and mem_bw_gbps "
                                "on nodes, if set)")
        if key not in self._index:
            self._index[key] = len(self.names)
            self.names.append(key)
            self.capacity.append(float(bw_gbps) * 1e3)  # GB/s -> bytes per microsecond
        return self._index[key]

    def host_of(self, node):
        """The CPU node whose memory holds ``node``'s ``host`` buffer: the CPU with the fewest
        hops from it through PCIe switches (never through another GPU), ties by name; the
        node itself when no CPU is reachable that way.

        >>> from collectx.topology import load
        >>> routes_for(load("dgx1v")).host_of("GPU5")
        'CPU1'
        """
        key = ("host", node)
        if key not in self._routes:
            self._routes[key] = _nearest_cpu(self.topo, node)
        return self._routes[key]

    def stages_to(self, host, b) -> bool:
        """Whether ``b`` can read ``host``'s memory without going through another GPU: not
        across hosts of a multi-host NVLink domain, whose sockets share no memory."""
        key = ("stages", host, b)
        if key not in self._routes:
            region = self._host_region(host, b)
            self._routes[key] = region is not None and nx.has_path(region, host, b)
        return self._routes[key]

    def route(self, a, b) -> tuple[tuple[int, ...], float]:
        """(resource ids, latency in us) for a transfer from node ``a`` to node ``b``."""
        key = (a, b)
        if key not in self._routes:
            self._routes[key] = self._local(a) if a == b else self._remote(a, b)
        return self._routes[key]

    def spread(self, a, b) -> tuple[tuple[tuple[int, ...], float, float], ...]:
        """How a transfer from ``a`` to ``b`` splits over routes: (resources, latency, share).

        Switch fabrics (NVSwitch planes) stripe every GPU-to-GPU transfer over all the switches
        the two GPUs share, so such a pair gets its max-flow through the switches, not one
        switch's bandwidth; elsewhere a transfer takes its single route (:meth:`route`).
        """
        key = ("spread", a, b)
        if key not in self._routes:
            self._routes[key] = self._striped(a, b) or ((*self.route(a, b), 1.0),)
        return self._routes[key]

    def merged(self, a, b) -> tuple[tuple[tuple[int, ...], float, float], ...]:
        """:meth:`spread` with the stripes over twin planes (:func:`twin_fabrics`) run as one
        route over the planes' summed links, the resources of :attr:`folded`: what the
        simulator runs. Fair shares scale with capacity, so stripes in the planes' own
        proportions end together, as the one flow does; with four planes, a switched machine
        simulates a quarter of the flows."""
        key = ("merged", a, b)
        if key not in self._routes:
            self._routes[key] = self._merged(self.spread(a, b))
        return self._routes[key]

    def _merged(self, stripes: tuple) -> tuple:
        """``stripes`` with those over the twin planes as one stripe over the summed links.
        Every stripe that crosses a folded link must take the summed one, or that link's
        bytes would be counted twice: a pair that also stripes over a switch outside the
        twins (a plane that misses some GPU) keeps that stripe apart."""
        twins: dict = {}
        rest = []
        for res, lat, share in stripes:
            folded = tuple(self._fold.get(r, -1) for r in res)
            if len(stripes) > 1 and -1 not in folded:
                twins[folded, lat] = twins.get((folded, lat), 0.0) + share
            else:
                rest.append((res, lat, share))
        return tuple((res, lat, share) for (res, lat), share in twins.items()) + tuple(rest) \
            if twins else stripes

    def _all_striped(self, group: tuple) -> bool:
        """Whether every GPU pair without a link of its own stripes over the planes of
        ``group`` (:func:`twin_fabrics`; their summed paths, through the switches the two
        GPUs hang off, are wider than the pair's widest single route): then no route crosses
        one plane alone, as a relay through another GPU could."""
        topo = self.topo
        ends = [(g, role) for role in group for g in _gpus_of(topo, role[0])]
        for a, ra in ends:
            for b, rb in ends:
                if a == b or topo.has_edge(a, b):
                    continue
                links = [[(a, sa), (sb, b)] if ra is rb else [(a, sa), (sa, sb), (sb, b)]
                         for sa, sb in zip(ra, rb)]   # per plane: a's switch, b's switch
                if not all(topo.has_edge(*e) for path in links for e in path):
                    return False   # a plane that joins the two only through another switch
                width = sum(min(topo.edges[e]["bw_gbps"] for e in path) for path in links)
                if self._wider_detour(a, b, width):
                    return False
        return True

    def _fold_fabric(self, group: tuple) -> None:
        """Resources for the links of ``group``'s planes (:func:`twin_fabrics`) summed across
        the planes, per GPU and direction and per link between two of a plane's switches;
        each member link's part of its sum is its share of the bytes the sum carries."""
        topo = self.topo
        for role in group:
            gpus = sorted(_gpus_of(topo, role[0]), key=str)
            for n in gpus:
                self._fold_links([(n, k) for k in role], (n, role))
            for n in gpus:
                self._fold_links([(k, n) for k in role], (role, n))
        for ra in group:
            for rb in group:
                if ra is not rb and topo.has_edge(ra[0], rb[0]):
                    self._fold_links(list(zip(ra, rb)), (ra, rb))

    def _fold_links(self, links: list, key: tuple) -> None:
        total = sum(self.topo.edges[e]["bw_gbps"] for e in links)
        at = self._resource(key, total)
        self.folded[at] = tuple((self._index[e], self.topo.edges[e]["bw_gbps"] / total)
                                for e in links)
        self._fold.update((self._index[e], at) for e in links)

    def wait_us(self, a, b) -> float:
        """The longest latency (us) among the routes a transfer from ``a`` to ``b`` splits
        over: how long its slowest stripe waits before its first byte moves."""
        return max(lat for _, lat, _ in self.spread(a, b))

    def bandwidth(self, a, b) -> float:
        """GB/s of a transfer from ``a`` to ``b``: each route's narrowest resource, summed
        over the routes it splits over."""
        return sum(min(self.capacity[r] for r in res) for res, _, _ in self.spread(a, b)
                   if res) / 1e3

    def _striped(self, a, b):
        if a == b or self.topo.has_edge(a, b):
            return None
        region = self._region(a, b)
        fabric = [n for n, k in region.nodes(data="kind") if k in SWITCH_KINDS]
        if not fabric:
            return None
        sub = region.subgraph([a, b, *fabric])
        if not (sub.has_node(a) and sub.out_degree(a) and sub.in_degree(b)):
            return None
        value, flow = nx.maximum_flow(sub, a, b, capacity="bw_gbps")
        if value <= 0 or self._wider_detour(a, b, value):
            return None
        return tuple((tuple(self._index[e] for e in zip(hops, hops[1:])),
                      _route_latency(self.topo, hops), amount / value)
                     for hops, amount in _decompose(flow, a, b))

    def _wider_detour(self, a, b, width: float) -> bool:
        """Whether the widest single route from ``a`` to ``b`` is at least ``width`` GB/s wide
        and stays on GPU links (NVLink, xGMI), relaying through another GPU. A wider PCIe
        route does not count: GPUs joined through switches copy to each other over them."""
        res = self.route(a, b)[0]
        return width <= self._narrowest(res) * (1 + 1e-9) and all(
            self.topo.edges[self.names[r]].get("type") in GPU_LINK_TYPES for r in res)

    def _narrowest(self, res: tuple[int, ...]) -> float:
        """GB/s of the narrowest of the resources ``res``."""
        return min(self.capacity[r] for r in res) / 1e3

    def _local_bw(self, node) -> float:
        data = self.topo.nodes[node]
        return self.local_bw_gbps or data.get("mem_bw_gbps") or LOCAL_BW_GBPS.get(
            data.get("device", "gpu"), LOCAL_BW_GBPS["gpu"])

    def _region(self, a, b) -> nx.DiGraph:
        """The subgraph a route from ``a`` to ``b`` may take: on a multi-node cluster, the two
        ends' machines plus the network (traffic between machines never relays through a third
        machine's GPUs, and traffic inside a machine never leaves it, as in NCCL); else all.

        Searching that region instead of the whole cluster keeps routes of a 128-GPU cluster
        to milliseconds each.
        """
        if self._parts is None:
            parts = _machine_parts(self.topo)
            self._parts = parts if len(set(parts.values())) > 1 else {}
        pa, pb = self._parts.get(a), self._parts.get(b)
        if pa is None or pb is None:
            return self.topo
        key = ("region", *sorted((pa, pb)))
        if key not in self._routes:
            keep = [n for n, p in self._parts.items() if p in (pa, pb)] if pa == pb else [
                n for n in self.topo if self._parts.get(n, pa) in (pa, pb)]
            self._routes[key] = self.topo.subgraph(keep).copy()
        return self._routes[key]

    def _host_region(self, a, b) -> nx.DiGraph | None:
        """For a transfer between a GPU and host memory (a CPU node): the graph without the
        other GPUs, since staging through host memory never relays through a GPU. None for
        transfers between two GPUs."""
        kinds = self.topo.nodes
        if kinds[a].get("kind") == "gpu" and kinds[b].get("kind") == "gpu":
            return None
        key = ("host region", a, b)
        if key not in self._routes:
            region = self._region(a, b)
            self._routes[key] = region.subgraph(
                n for n in region if n in (a, b) or region.nodes[n].get("kind") != "gpu").copy()
        return self._routes[key]

    def _local(self, node) -> tuple[tuple[int, ...], float]:
        return (self._index[("local", node)],), 0.0

    def _remote(self, a, b) -> tuple[tuple[int, ...], float]:
        # A direct link is what a peer-to-peer copy uses, even where a wider detour exists
        # (DGX-1: GPU0-GPU1 is one NVLink, GPU0-GPU3-GPU2-GPU1 are doubled ones).
        hops = (a, b) if self.topo.has_edge(a, b) else self._widest_hops(self._host_region(a, b)
                                                                         or self._region(a, b), a, b)
        links = tuple(self._index[(u, v)] for u, v in zip(hops, hops[1:]))
        return links, _route_latency(self.topo, hops)

    def _widest_hops(self, region: nx.DiGraph, a, b) -> tuple:
        """``widest_path(region, a, b).hops``, preparing the region's links once and the
        bottleneck widths once per source (a 16-GPU switch machine asks 240 pairs; preparing
        the sorted adjacency per pair was half of routing it)."""
        from .paths import _fewest_hops, _Links, _widest_bottlenecks, widest_path

        key = ("widths", id(region), a)
        if key not in self._routes:
            lkey = ("links", id(region))
            if lkey not in self._routes:   # the region is kept alive by its own cache entry
                self._routes[lkey] = (region, _Links(region))
            links = self._routes[lkey][1]
            self._routes[key] = (links, _widest_bottlenecks(links, a))
        links, widths = self._routes[key]
        if b not in widths:    # unreachable: widest_path raises the error that says so
            return widest_path(region, a, b).hops
        return _fewest_hops(links, a, {b}, widths[b])[b]


def twin_planes(topo: nx.DiGraph) -> list[tuple]:
    """Groups of switches that every transfer through them stripes over in one fixed
    proportion: each is joined to every GPU of ``topo`` and to nothing else, and each GPU's
    links to (and from) the group's switches have one latency and bandwidths in one ratio
    across the switches (an HGX board's NVSwitch chips). A board with one link narrowed or
    down keeps the planes whose links still are in one ratio as a group, the others apart.
    :class:`Routes` folds them only where every GPU pair without a link of its own does stripe
    over them (no relay through a GPU crosses one alone).

    >>> from collectx.topology import load
    >>> G = load("dgx_h100")
    >>> twin_planes(G)
    [('NVS0', 'NVS1', 'NVS2', 'NVS3')]
    >>> G.edges["GPU1", "NVS0"]["bw_gbps"] /= 2
    >>> twin_planes(G)
    [('NVS1', 'NVS2', 'NVS3')]
    """
    return [group[0] for group in twin_fabrics(topo) if len(group) == 1]


def twin_fabrics(topo: nx.DiGraph) -> list[tuple]:
    """Groups of switch planes that every transfer through them stripes over in one fixed
    proportion, where a plane is one switch joined to every GPU or several switches linked to
    each other, each GPU on one of them (a DGX-2's two baseboards). The planes of a group
    have switches in the same roles (joined to the same GPUs, and to nothing else but each
    other), and their links, GPU to switch and switch to switch, in one ratio across the
    planes at one latency. A group is a tuple of roles, each the role's switches in plane
    order; :func:`twin_planes` is the groups of one role.

    >>> from collectx.topology import load
    >>> twin_fabrics(load("dgx_h100"))
    [(('NVS0', 'NVS1', 'NVS2', 'NVS3'),)]
    >>> [[role[:2] for role in g] for g in twin_fabrics(load("dgx2"))]
    [[('NVSA0', 'NVSA1'), ('NVSB0', 'NVSB1')]]
    """
    gpus = {n for n, k in topo.nodes(data="kind") if k == "gpu"}
    switches = _switches(topo)
    links = nx.Graph()
    links.add_nodes_from(switches)
    links.add_edges_from((u, v) for u, v in topo.edges if u in switches and v in switches)
    planes: dict = {}   # the GPU sets of a plane's switches -> its switches in that order
    for part in nx.connected_components(links):
        roles = {}
        for s in part:
            near = set(topo.predecessors(s)) | set(topo.successors(s))
            mine = set(topo.predecessors(s)) & gpus
            if near - gpus - part or mine != set(topo.successors(s)) & gpus or not mine:
                break
            roles[frozenset(mine)] = s
        else:
            if len(roles) == len(part) and set().union(*roles) == gpus and \
                    sum(map(len, roles)) == len(gpus):
                order = sorted(roles, key=lambda r: sorted(map(str, r)))
                planes.setdefault(tuple(order), []).append(tuple(roles[r] for r in order))
    groups = []
    for _, same in sorted(planes.items(), key=str):
        kept: list[list] = []
        # being in one ratio is an equivalence: one pass sorts the planes
        for plane in sorted(same, key=lambda p: str(p[0])):
            group = next((g for g in kept if _planes_in_ratio(topo, (g[0], plane))), None)
            if group is None:
                kept.append([plane])
            else:
                group.append(plane)
        groups += [tuple(zip(*g)) for g in kept if len(g) > 1]
    return groups


def _planes_in_ratio(topo: nx.DiGraph, planes: tuple) -> bool:
    """Whether the second of two planes (switches in role order, :func:`twin_fabrics`) has
    the first's links, to the GPUs and between its switches, each times one factor and at the
    same latency, and no others."""
    first, other = planes
    twin = dict(zip(first, other))
    pairs = [(e, tuple(twin.get(n, n) for n in e)) for e in topo.edges
             if e[0] in twin or e[1] in twin]
    if len(pairs) != sum(1 for u, v in topo.edges if u in other or v in other) or \
            not all(topo.has_edge(*b) for _, b in pairs):
        return False
    ratio = topo.edges[pairs[0][1]]["bw_gbps"] / topo.edges[pairs[0][0]]["bw_gbps"]
    return all(_latency(topo.edges[a]) == _latency(topo.edges[b]) and
               abs(topo.edges[b]["bw_gbps"] - ratio * topo.edges[a]["bw_gbps"]) <=
               1e-9 * topo.edges[b]["bw_gbps"] for a, b in pairs)


def _switches(topo: nx.DiGraph) -> set:
    return {s for s, kind in topo.nodes(data="kind") if kind in SWITCH_KINDS}


def _gpus_of(topo: nx.DiGraph, switch) -> list:
    """The GPUs ``switch`` links to."""
    return [g for g in topo.successors(switch) if topo.nodes[g].get("kind") == "gpu"]


def uneven_planes(topo: nx.DiGraph) -> bool:
    """Whether two or more switch planes lie between the GPUs alone and some GPU reaches them
    in other proportions than the rest (a link narrowed, missing or of another width): each
    GPU pair then stripes over the planes both reach in a proportion of its own
    (:class:`Routes`), where free switching (what a cut or a flow through the switches
    assumes) would balance the planes, so cut bounds overstate what such a fabric carries.
    Planes every GPU reaches in one ratio (:func:`twin_planes`) stripe as free switching
    would, as does a single plane.

    >>> from collectx.topology import load, multi_node
    >>> G = load("dgx_h100")
    >>> uneven_planes(G)
    False
    >>> G.remove_edge("GPU1", "NVS0"); G.remove_edge("NVS0", "GPU1")
    >>> uneven_planes(G)
    True
    >>> uneven_planes(multi_node("dgx_h100", 2, nic_bw=50.0))   # each machine on its own
    False
    """
    gpus = {n for n, k in topo.nodes(data="kind") if k == "gpu"}
    around = {s: set(topo.predecessors(s)) | set(topo.successors(s))
              for s, kind in topo.nodes(data="kind") if kind in SWITCH_KINDS}
    fabrics = nx.Graph((s, g) for s, near in around.items() if near <= gpus for g in near)
    for fabric in nx.connected_components(fabrics):   # one per machine of a cluster
        planes = [s for s in fabric if s in around]
        twins = twin_planes(topo.subgraph(fabric))
        if len(planes) > 1 and not (len(twins) == 1 and len(twins[0]) == len(planes)):
            return True
    return False


def _nearest_cpu(topo: nx.DiGraph, node):
    if topo.nodes[node].get("kind") == "cpu":
        return node
    seen, frontier = {node}, [node]
    while frontier:
        cpus = sorted((n for n in frontier if topo.nodes[n].get("kind") == "cpu"), key=str)
        if cpus:
            return cpus[0]
        nxt = []
        for u in frontier:
            for v in topo.successors(u):
                # GPUs do not forward PCIe traffic, and host staging never crosses NVLink.
                if v not in seen and topo.nodes[v].get("kind") != "gpu" and \
                        topo.edges[u, v].get("type") not in ("nvlink", "xgmi", "net"):
                    seen.add(v)
                    nxt.append(v)
        frontier = nxt
    return node


def _decompose(flow: dict, a, b) -> list[tuple[list, float]]:
    """Split an a->b flow (networkx ``maximum_flow`` dict) into paths with their amounts."""
    left = {u: {v: f for v, f in out.items() if f > 1e-12} for u, out in flow.items()}
    found = []
    while left.get(a):
        hops, node = [a], a
        while node != b:
            node = max(left[node], key=left[node].get)
            hops.append(node)
            if len(hops) > len(left) + 1:  # a cycle of leftover flow: nothing more to route
                return found
        amount = min(left[u][v] for u, v in zip(hops, hops[1:]))
        for u, v in zip(hops, hops[1:]):
            left[u][v] -= amount
            if left[u][v] <= 1e-12:
                del left[u][v]
        found.append((hops, amount))
    return found


def _route_latency(topo: nx.DiGraph, hops: tuple) -> float:
    """A route's latency: its slowest link's, paid once. Switches and bridges forward cut-through
    (a PCIe switch in about 0.1-0.2 us, an NVSwitch likewise), far below the end-to-end
    transaction a link type's latency stands for, so a route pays that once however many
    switches it crosses, as NCCL charges one latency per peer hop by the path's type. Summed
    per link, a dump that lists every bridge level would charge a GPU's copy to host memory
    four PCIe latencies where it pays one."""
    return max(_latency(topo.edges[u, v]) for u, v in zip(hops, hops[1:]))


def _latency(edge: dict) -> float:
    lat = edge.get("latency_us")
    if lat is None:
        lat = DEFAULT_LATENCY_US.get(edge.get("type"), _FALLBACK_LATENCY_US)
    return float(lat)


def _machine_parts(topo: nx.DiGraph) -> dict:
    """Node -> machine index: the parts left once ``net`` links and net switches are removed
    (network switches map to no machine)."""
    local = nx.Graph()
    local.add_nodes_from(n for n, k in topo.nodes(data="kind") if k != "net_switch")
    local.add_edges_from((u, v) for u, v, t in topo.edges(data="type")
                         if t != "net" and u in local and v in local)
    return {n: i for i, part in enumerate(nx.connected_components(local)) for n in part}


def routes_for(topo: nx.DiGraph, local_bw_gbps: float | None = None) -> Routes:
    """The :class:`Routes` of ``topo``, shared by every graph with the same routing content.

    Planning routes one allocation several times over different graph objects (the planner's
    view, the job graph of the tree packings, ring search), and striping a transfer over switch
    planes costs a max-flow per GPU pair: the table is keyed by what routes depend on (node
    kinds and memories, links with their bandwidth, type and latency, in graph order), so
    equal graphs share it and an edited graph gets a fresh one.
    """
    key = (local_bw_gbps, fingerprint(topo))
    routes = _CACHE.get(key)
    if routes is None:
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.clear()
        # A copy: routes are computed lazily, and the caller may edit its graph afterwards.
        routes = _CACHE[key] = Routes(topo.copy(), local_bw_gbps)
    return routes


def fingerprint(topo: nx.DiGraph) -> tuple:
    """What routes depend on, as a hashable key: node kinds and memories, links with their
    bandwidth, type and latency, in graph order (equal graphs, equal keys)."""
    nodes = tuple((n, d.get("kind"), d.get("device"), d.get("mem_bw_gbps"))
                  for n, d in topo.nodes(data=True))
    edges = tuple((u, v, d.get("bw_gbps"), d.get("type"), d.get("latency_us"))
                  for u, v, d in topo.edges(data=True))
    return nodes, edges
