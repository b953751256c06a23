"""Schedule IR and its interpreters that need no hardware: verify, simulate, MSCCL export."""

from .ir import (BUFFERS, COLLECTIVES, SCHEMA, Dep, Instr, Lane, Ref, Schedule, alias,
                 buffer_units, chunk_span, range_span)

__all__ = ["BUFFERS", "COLLECTIVES", "SCHEMA", "Dep", "Instr", "Lane", "Ref", "Schedule", "alias",
           "buffer_units", "chunk_span", "range_span"]

from .builder import ScheduleBuilder
from .metrics import algbw, bus_factor, busbw, unit_bytes
from .simulate import SimResult, simulate
from .verify import VerifyReport, verify

__all__ += ["ScheduleBuilder", "SimResult", "VerifyReport", "algbw", "bus_factor", "busbw",
            "simulate", "unit_bytes", "verify"]
