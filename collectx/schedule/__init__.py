"""Schedule IR and its interpreters that need no hardware: verify, simulate, MSCCL export."""

from .ir import (BUFFERS, COLLECTIVES, SCHEMA, Dep, Instr, Lane, Ref, Schedule, alias,
                 buffer_units, chunk_span, range_span)

__all__ = ["BUFFERS", "COLLECTIVES", "SCHEMA", "Dep", "Instr", "Lane", "Ref", "Schedule", "alias",
           "buffer_units", "chunk_span", "range_span"]

from .builder import ScheduleBuilder
from .metrics import algbw, bus_factor, busbw, unit_bytes
from .msccl import lower_to_msccl, to_msccl_xml
from .msccl_xml import parse_msccl_xml
from .simulate import SimResult, simulate
from .verify import VerifyReport, verify

__all__ += ["ScheduleBuilder", "SimResult", "VerifyReport", "algbw", "bus_factor", "busbw",
            "lower_to_msccl", "parse_msccl_xml", "simulate", "to_msccl_xml", "unit_bytes",
            "verify"]
