"""Every baseline planner's output passes verify: generated topologies and every preset."""

import pytest

import collectx.topology as T
from collectx.planner import ALGORITHMS
from collectx.planner.registry import collectives_of
from collectx.schedule.ir import ROOTED
from collectx.schedule.verify import verify

BASELINES = ("direct", "ring", "tree")
GENERATORS = {"ring": T.ring, "fully_connected": T.fully_connected, "switch": T.switch}
FAST_N = (1, 2, 3, 5, 8)
SLOW_N = tuple(n for n in range(1, 17) if n not in FAST_N)


def _check_all(algo, G, nbytes=1 << 20):
    ranks = tuple(T.gpus(G))
    n = len(ranks)
    for coll in sorted(collectives_of(algo)):
        for inplace in (False, True):
            if inplace and coll == "alltoall":
                continue
            for root in sorted({0, n - 1}) if coll in (*ROOTED, "sendrecv") else (0,):
                s = ALGORITHMS[algo](G, ranks, coll, nbytes, root=root, inplace=inplace)
                assert s.nranks == n and s.collective == coll and s.inplace == inplace
                verify(s)


@pytest.mark.parametrize("gen", sorted(GENERATORS))
@pytest.mark.parametrize("algo", BASELINES)
@pytest.mark.parametrize("n", FAST_N)
def test_generated_topologies(algo, gen, n):
    _check_all(algo, GENERATORS[gen](n))


@pytest.mark.slow
@pytest.mark.parametrize("gen", sorted(GENERATORS))
@pytest.mark.parametrize("algo", BASELINES)
@pytest.mark.parametrize("n", SLOW_N)
def test_generated_topologies_all_sizes(algo, gen, n):
    _check_all(algo, GENERATORS[gen](n))


@pytest.mark.parametrize("preset", T.presets())
@pytest.mark.parametrize("algo", BASELINES)
def test_presets_full_machine(algo, preset):
    _check_all(algo, T.load(preset), nbytes=4096)


@pytest.mark.parametrize("nchunks", [1, 3, 17])
@pytest.mark.parametrize("algo", BASELINES)
def test_forced_chunk_counts(algo, nchunks):
    G = T.load("dgx1v")
    ranks = tuple(T.gpus(G))
    for coll in sorted(collectives_of(algo)):
        s = ALGORITHMS[algo](G, ranks, coll, 1 << 20, nchunks=nchunks)
        assert s.nchunks == nchunks
        verify(s)
