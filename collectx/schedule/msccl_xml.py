"""MSCCL algorithm XML as plain data: write it, read it, check its internal references.

The format (microsoft/msccl ``src/graph/topo.cc`` ``mscclGetAlgoFromXMLAndSetAlgo``)::

    <algo name nchunksperloop nchannels proto ngpus coll inplace>
      <gpu id i_chunks o_chunks s_chunks>
        <tb id send recv chan>
          <step s type srcbuf srcoff dstbuf dstoff cnt depid deps hasdep/>

``tb`` ids are dense per GPU, ``s`` dense per tb; ``depid``/``deps`` name one (tb, step) of the
same GPU to wait for (-1 = none); ``hasdep`` says another step waits on this one.
"""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET

from ..errors import ScheduleError

STEP_TYPES = ("s", "r", "rcs", "rrs", "rrc", "rrcs", "cpy", "re", "ra", "nop")


@dataclasses.dataclass
class MscclStep:
    type: str
    srcbuf: str = "i"
    srcoff: int = 0
    dstbuf: str = "i"
    dstoff: int = 0
    cnt: int = 1
    depid: int = -1
    deps: int = -1
    hasdep: int = 0
    origin: object = dataclasses.field(default=None, compare=False)  # IR Dep; never written


@dataclasses.dataclass
class MscclTb:
    id: int
    send: int = -1
    recv: int = -1
    chan: int = 0
    steps: list[MscclStep] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class MscclGpu:
    id: int
    i_chunks: int
    o_chunks: int
    s_chunks: int
    tbs: list[MscclTb] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class MscclAlgo:
    name: str
    coll: str
    ngpus: int
    nchunksperloop: int
    nchannels: int
    inplace: bool
    proto: str = "Simple"
    gpus: list[MscclGpu] = dataclasses.field(default_factory=list)
    extra: dict = dataclasses.field(default_factory=dict)  # minBytes, maxBytes, nthreads...

    def steps_per_gpu(self) -> list[int]:
        return [sum(len(tb.steps) for tb in g.tbs) for g in self.gpus]


_STEP_INTS = ("srcoff", "dstoff", "cnt", "depid", "deps", "hasdep")
_STEP_ATTRS = ("srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep")


def render(algo: MscclAlgo) -> str:
    """The XML text of ``algo`` (one element per line, as MSCCL's own generators write it)."""
    root = ET.Element("algo", {
        "name": algo.name, "nchunksperloop": str(algo.nchunksperloop),
        "nchannels": str(algo.nchannels), "proto": algo.proto, "ngpus": str(algo.ngpus),
        "coll": algo.coll, "inplace": str(int(algo.inplace)),
        **{k: str(v) for k, v in algo.extra.items()}})
    for g in algo.gpus:
        ge = ET.SubElement(root, "gpu", {"id": str(g.id), "i_chunks": str(g.i_chunks),
                                         "o_chunks": str(g.o_chunks), "s_chunks": str(g.s_chunks)})
        for tb in g.tbs:
            te = ET.SubElement(ge, "tb", {"id": str(tb.id), "send": str(tb.send),
                                          "recv": str(tb.recv), "chan": str(tb.chan)})
            for i, st in enumerate(tb.steps):
                ET.SubElement(te, "step", {"s": str(i), "type": st.type,
                                           **{k: str(getattr(st, k)) for k in _STEP_ATTRS}})
    ET.indent(root, space="  ")
    return ET.tostring(root, encoding="unicode") + "\n"


def parse_msccl_xml(text: str) -> MscclAlgo:
    """Read MSCCL algorithm XML into :class:`MscclAlgo` and check its references.

    Raises
    ------
    ScheduleError
        Malformed XML, missing attributes, non-dense ids, unknown step types, or a dependency
        naming a threadblock or step that does not exist.

    Examples
    --------
    >>> a = parse_msccl_xml('<algo name="x" nchunksperloop="1" nchannels="1" proto="Simple" '
    ...     'ngpus="1" coll="allreduce" inplace="0"><gpu id="0" i_chunks="1" o_chunks="1" '
    ...     's_chunks="0"><tb id="0" send="-1" recv="-1" chan="0"><step s="0" type="cpy" '
    ...     'srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" '
    ...     'hasdep="0"/></tb></gpu></algo>')
    >>> a.coll, a.steps_per_gpu()
    ('allreduce', [1])
    """
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise ScheduleError(f"MSCCL XML does not parse: {e}; expected an <algo> document") from e
    if root.tag != "algo":
        raise ScheduleError(f"MSCCL XML root is <{root.tag}>; expected <algo>")
    a = dict(root.attrib)
    known = ("name", "coll", "ngpus", "nchunksperloop", "nchannels", "inplace", "proto")
    algo = MscclAlgo(name=_get(a, "name", str, "algo"), coll=_get(a, "coll", str, "algo"),
                     ngpus=_get(a, "ngpus", int, "algo"),
                     nchunksperloop=_get(a, "nchunksperloop", int, "algo"),
                     nchannels=_get(a, "nchannels", int, "algo"),
                     inplace=bool(_get(a, "inplace", int, "algo")), proto=a.get("proto", "Simple"),
                     extra={k: v for k, v in a.items() if k not in known})
    for ge in root.findall("gpu"):
        g = MscclGpu(*(_get(ge.attrib, k, int, "gpu") for k in
                       ("id", "i_chunks", "o_chunks", "s_chunks")))
        for te in ge.findall("tb"):
            tb = MscclTb(*(_get(te.attrib, k, int, "tb") for k in ("id", "send", "recv", "chan")))
            tb.steps = [_parse_step(se.attrib) for se in te.findall("step")]
            g.tbs.append(tb)
        algo.gpus.append(g)
    check(algo)
    return algo


def _get(attrs: dict, key: str, kind, where: str):
    if key not in attrs:
        raise ScheduleError(f"<{where}> lacks attribute {key!r}; have {sorted(attrs)}")
    try:
        return kind(attrs[key])
    except ValueError as e:
        raise ScheduleError(f"<{where} {key}={attrs[key]!r}>: expected {kind.__name__}") from e


def _parse_step(attrs: dict) -> MscclStep:
    st = MscclStep(type=_get(attrs, "type", str, "step"),
                   srcbuf=attrs.get("srcbuf", "i"), dstbuf=attrs.get("dstbuf", "i"),
                   **{k: _get(attrs, k, int, "step") for k in _STEP_INTS if k in attrs})
    if st.type not in STEP_TYPES:
        raise ScheduleError(f"<step type={st.type!r}>: expected one of {STEP_TYPES}")
    return st


def check(algo: MscclAlgo) -> None:
    """Check dense ids and that every ``depid``/``deps`` names an existing step."""
    if [g.id for g in algo.gpus] != list(range(algo.ngpus)):
        raise ScheduleError(f"gpu ids {[g.id for g in algo.gpus]}; expected 0..{algo.ngpus - 1}")
    for g in algo.gpus:
        if [tb.id for tb in g.tbs] != list(range(len(g.tbs))):
            raise ScheduleError(f"gpu {g.id}: tb ids {[tb.id for tb in g.tbs]} are not dense")
        for tb in g.tbs:
            for i, st in enumerate(tb.steps):
                if st.depid < 0:
                    continue
                if st.depid >= len(g.tbs) or not 0 <= st.deps < len(g.tbs[st.depid].steps):
                    raise ScheduleError(f"gpu {g.id} tb {tb.id} step {i} waits on tb {st.depid} "
                                        f"step {st.deps}, which does not exist")
