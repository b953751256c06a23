"""collectx-perf's machinery: bandwidth sweeps read like nccl-tests, peers, predictions, reports.

Modules, in the order a run uses them: :mod:`~collectx.perf.options` (flags),
:mod:`~collectx.perf.sweep` (the per-rank timing and check loop) over
:mod:`~collectx.perf.collectives` (what each collective means) and
:mod:`~collectx.perf.buffers`; :mod:`~collectx.perf.peers`, :mod:`~collectx.perf.worker` and
:mod:`~collectx.perf.adapters` (Open MPI, gloo, NCCL through the same sweep);
:mod:`~collectx.perf.simulate` (``--simulate``); :mod:`~collectx.perf.table`,
:mod:`~collectx.perf.report`, :mod:`~collectx.perf.plot`, :mod:`~collectx.perf.html` (output);
:mod:`~collectx.perf.driver` ties them together for :func:`collectx.cli.perf.main`.
:mod:`~collectx.perf.threadcomm` is a numpy reference communicator of threads for tests.
"""
