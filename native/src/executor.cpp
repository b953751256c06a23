// CPU executor: one call runs this rank's part of a whole collective, tile after tile.
//
// How it works. Every rank owns one shared-memory window (control block + two staging sets). A
// call is cut into tiles of at most `tile_count` elements per unit so a fixed-size window serves
// any message. For each tile (epoch e):
//   1. stage: copy this tile of the user's input into my staging set e%2 (skipped when no peer
//      reads my input: the schedule then reads the user's buffer in place);
//   2. barrier: publish ready=e, wait until every peer's ready >= e. On the first tile, compare
//      every rank's call descriptor (mismatch -> every rank returns CX_EXEC_MISMATCH);
//   3. run my lanes, interleaved in this one thread: round-robin over lanes, running the next
//      instruction of any lane whose deps (epoch-stamped flags of any rank's lanes) are met, so
//      lanes never deadlock each other; publish my lane flag after each instruction;
//   4. wait for the instructions that write my output (fin_deps), copy the tile out, scale (avg);
//   5. when any rank's buffer lives in its window heap (Communicator.empty, read in place by
//      peers), wait until every lane of every rank has finished the tile before returning, so
//      no caller reuses a buffer a peer is still reading.
// A rank may instead let peers read its user buffers across processes (call->cma_in/cma_out,
// executor_cma.cpp): it stages nothing, its instructions use its user buffers in place, and a
// peer's source ref into them becomes a process_vm_readv, into the destination for a copy and
// into a cache-sized bounce buffer for a reduce. Its last tile then waits as in 5.
//
// Cross-epoch safety comes from the double buffer plus the barrier: a peer that passed barrier e
// has finished every instruction of tile e-1 (it only publishes ready=e after completing e-1),
// so writes into set e%2 can only race with tile e-2, which every rank finished before
// publishing ready=e-1 -- and I saw those before running e-1. One barrier per tile, no trailing one.
//
// Every wait goes through cx_exec::Waiter (executor_wait.cpp): spin, then sleep on a futex
// doorbell that publishing peers ring, and about every millisecond check peers' liveness, abort
// words and the deadline.

#include "cx_executor.h"
#include "cx_instr.h"
#include "cx_kernels.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <cstddef>
#include <memory>

static_assert(offsetof(cx_ctl, base) == 16 && offsetof(cx_ctl, ready) == 64 &&
                  offsetof(cx_ctl, abort_word) == 128 &&
                  offsetof(cx_ctl, desc) == 256 && offsetof(cx_ctl, lane_flag) == 1024 &&
                  sizeof(cx_ctl) <= CX_CTL_BYTES,
              "window.py addresses the control block by these byte offsets");

using namespace cx_exec;

namespace {

constexpr uint64_t kAbortedCall = 0xFFFF;  // descriptor "collective" code of an aborted call
constexpr int kMaxRanks = 256;
constexpr int kDescCompared = 6;           // seq, collective, dtype, op, count, root
constexpr int kDescHeap = 6;               // desc[6 + b]: heap offset + 1 of buffer b, or 0
constexpr int kDescCma = 8;                // desc[8 + b]: address of buffer b for CMA, or 0
constexpr size_t kBounceBytes = 256 << 10; // a reduce's CMA sources, read piece by piece
constexpr int kMaxPush = 64;               // pushed copies run inside one instruction, at most

struct Ctx {
    const cx_exec_plan* plan;
    const cx_exec_window* win;
    const cx_exec_call* call;
    cx_exec_result* res;
    size_t esize;
    uint64_t epoch;
    int64_t tile_off, tile_len;
    int64_t deadline;
    bool zero_copy;
    bool cma_any;   // some rank's buffers are read across processes in this call
    int fail_rank;  // the peer a failed CMA read named
    // The pushed copies fused into the instruction being run (see fusable_push): their
    // destination refs, peers' outputs.
    const int32_t* push_ref[kMaxPush];
    int npush;
    // My input (0) and output (1) in the user's buffer at this tile, and which of their chunks
    // (unit * nchunks + chunk) are used there in place: all, none (NULL), or those set in mask.
    char* user[2];
    bool all_direct[2];
    const uint8_t* direct[2];
    // Chunks of my output staged in the window that my instructions also write through to the
    // user's buffer as they compute them (call->out_through), or NULL.
    const uint8_t* through;
    char* ptr[3 * kMaxRanks];
    int64_t stride[3 * kMaxRanks];
    // A peer's input (2r) and output (2r + 1) at this tile, as addresses in its process when it
    // lets peers read them across processes; NULL when it stages them in its window.
    const char* remote[2 * kMaxRanks];
};

inline bool is_direct(const Ctx& c, int b, int64_t j) {
    return c.all_direct[b] || (c.direct[b] && c.direct[b][j]);
}

// Point every (rank, buffer) at this tile: staging slots of set epoch%2, heap buffers in place,
// and, for chunks of mine that no peer touches, the user's own buffers (see is_direct).
void place_buffers(Ctx& c) {
    const cx_exec_plan* p = c.plan;
    const cx_exec_call* k = c.call;
    int64_t tc = k->tile_count, es = int64_t(c.esize);
    int64_t slot_off[3] = {0, p->units[0] * tc * es, (p->units[0] + p->units[1]) * tc * es};
    int64_t set = c.win->set_bytes * int64_t(c.epoch & 1);
    for (int r = 0; r < p->nranks; ++r)
        for (int b = 0; b < 3; ++b) {
            c.ptr[3 * r + b] = c.win->data[r] + set + slot_off[b];
            c.stride[3 * r + b] = tc;
        }
    // Buffers that live in a rank's heap (Communicator.empty) are used in place, whole.
    const int slot = int(k->seq & 1);
    for (int r = 0; r < p->nranks; ++r)
        for (int b = 0; b < 2; ++b) {
            uint64_t at = load_acq(&c.win->ctl[r]->desc[slot][kDescHeap + b]);
            uint64_t cma = r == p->rank ? 0 : load_acq(&c.win->ctl[r]->desc[slot][kDescCma + b]);
            c.remote[2 * r + b] = cma ? (const char*)uintptr_t(cma) + c.tile_off * es : nullptr;
            if (at == 0) continue;
            c.ptr[3 * r + b] = c.win->heap[r] + int64_t(at - 1) + c.tile_off * es;
            c.stride[3 * r + b] = k->count;
        }
    const void* user[2] = {k->user_in, k->user_out};
    const int priv[2] = {k->in_private, k->out_private};
    const long long heap[2] = {k->in_heap, k->out_heap};
    const uint8_t* mask[2] = {k->in_direct, k->out_direct};
    const int cma[2] = {k->cma_in, k->cma_out};
    for (int b = 0; b < 2; ++b) {
        bool usable = user[b] && heap[b] < 0;
        c.user[b] = usable ? (char*)user[b] + c.tile_off * es : nullptr;
        c.all_direct[b] = usable && (cma[b] || (!mask[b] && priv[b]));
        c.direct[b] = usable ? mask[b] : nullptr;
    }
    bool through = c.user[1] && !c.all_direct[1] && !k->cma_in && !k->cma_out;
    c.through = through ? k->out_through : nullptr;
}

inline bool is_through(const Ctx& c, int64_t j) { return c.through && c.through[j]; }

inline int64_t chunk_lo(int64_t i, int64_t nchunks, int64_t count) { return i * count / nchunks; }


// How many of the m chunks from ref's chunk + k on lie in the same place (staging slot or the
// user's buffer) as the first: a piece of an instruction must not straddle the two.
int64_t same_place(const Ctx& c, const int32_t* ref, int64_t k, int64_t m) {
    int b = ref[1];
    if (ref[0] != c.plan->rank || b > 1 || c.all_direct[b] || (!c.direct[b] && !c.through))
        return m;
    int64_t j = ref[2] + k;
    auto place = [&](int64_t i) { return 2 * is_direct(c, b, i) + (b == 1 && is_through(c, i)); };
    int64_t run = 1;
    while (run < m && place(j + run) == place(j)) ++run;
    return run;
}

inline const char* remote_of(const Ctx& c, const int32_t* ref) {
    return ref[0] != c.plan->rank && ref[1] < 2 ? c.remote[2 * ref[0] + ref[1]] : nullptr;
}

int cma_failed(Ctx& c, int err, int rank) {
    c.fail_rank = rank;
    return err == ESRCH ? CX_EXEC_PEER_DEAD : CX_EXEC_CMA;
}

// Moves n elements between local memory and `remote` in peer r's process (a status, naming r
// when it fails).
int cma_piece(Ctx& c, bool write, int r, char* remote, const void* local, int64_t n) {
    int64_t pid = int64_t(c.win->ctl[r]->pid);
    size_t bytes = size_t(n) * c.esize;
    int err = write ? cma_write(pid, remote, local, bytes)
                    : cma_read(pid, remote, const_cast<void*>(local), bytes);
    return err ? cma_failed(c, err, r) : CX_EXEC_OK;
}

// Where a piece also goes: addr in rank's process (a peer's buffer written across processes),
// or in mine when rank < 0 (the window).
struct Target {
    char* addr;
    int rank;
};

// Writes n elements from src to each of the targets, `at` bytes in.
int put(Ctx& c, const Target* t, int nt, int64_t at, const void* src, int64_t n) {
    for (int i = 0; i < nt; ++i) {
        if (t[i].rank >= 0) {
            if (int rc = cma_piece(c, true, t[i].rank, t[i].addr + at, src, n)) return rc;
        } else {
            cx_copy_impl(t[i].addr + at, src, size_t(n) * c.esize);
        }
    }
    return CX_EXEC_OK;
}

// One piece of an instruction that reads or writes peers' user buffers across processes
// (addr[s] is then the address in rank[s]'s process). A copy moves straight between its source
// and destination when at most one of them is remote; otherwise, and for a reduce, remote
// sources are read into the bounce buffer and a remote destination is written from it, a piece
// at a time, so the piece is still in this core's caches when it is written out.
int run_remote(Ctx& c, const int32_t* in, char** addr, const int* rank, int nsrc, int64_t len,
               const Target* push, int npush) {
    static thread_local std::unique_ptr<char, decltype(&free)> bounce(nullptr, &free);
    size_t es = c.esize;
    if (in[0] == 0 && npush == 0 && (rank[0] < 0 || rank[1] < 0))
        return rank[0] < 0 ? cma_piece(c, false, rank[1], addr[1], addr[0], len)
                           : cma_piece(c, true, rank[0], addr[0], addr[1], len);
    if (!bounce) bounce.reset(static_cast<char*>(aligned_alloc(4096, kBounceBytes)));
    if (!bounce) return CX_EXEC_KERNEL;
    int nbuf = rank[0] >= 0;  // bounce slots: one per remote source, one for a remote result
    for (int s = 1; s <= nsrc; ++s) nbuf += rank[s] >= 0;
    int64_t piece = int64_t(kBounceBytes / es / size_t(std::max(nbuf, 1))) & ~63;
    piece = std::max<int64_t>(1, piece);
    const void* src[64];
    for (int64_t off = 0; off < len; off += piece) {
        int64_t n = std::min(piece, len - off), at = off * int64_t(es);
        char* slot = bounce.get();
        for (int s = 1; s <= nsrc; ++s) {
            src[s - 1] = addr[s] + at;
            if (rank[s] < 0) continue;
            if (int rc = cma_piece(c, false, rank[s], addr[s] + at, slot, n)) return rc;
            src[s - 1] = slot;
            slot += piece * int64_t(es);
        }
        char* dst = rank[0] >= 0 ? slot : addr[0] + at;
        if (in[0] == 0) cx_copy_impl(dst, src[0], size_t(n) * es);
        else if (cx_reduce_impl(dst, src, nsrc, size_t(n), c.call->dtype, c.call->op) != 0)
            return CX_EXEC_KERNEL;
        if (rank[0] >= 0)
            if (int rc = cma_piece(c, true, rank[0], addr[0] + at, dst, n)) return rc;
        // The fused pushes: this piece, still in cache, into the peers' outputs.
        if (int rc = put(c, push, npush, at, dst, n)) return rc;
    }
    return CX_EXEC_OK;
}

// One piece of an instruction whose refs all lie in this process: len elements at addr.
int run_local(Ctx& c, const int32_t* in, char* const* addr, int nsrc, int64_t len) {
    if (in[0] == 0) {
        // A copy onto itself: an input stored in the output (allgather in place)
        if (addr[0] != addr[1]) cx_copy_impl(addr[0], addr[1], size_t(len) * c.esize);
    } else if (cx_reduce_impl(addr[0], (const void* const*)(addr + 1), nsrc, size_t(len),
                              c.call->dtype, c.call->op) != 0) {
        return CX_EXEC_KERNEL;
    }
    return CX_EXEC_OK;
}

// A piece whose destination also goes elsewhere: a chunk of my output in the window to the
// user's buffer at `user`, and/or a pushed chunk to peers' outputs (`push`): computed and
// copied there in parts small enough that the copies read them from L1 (a part's sources
// stream through L1 too). 2-rank in-place allreduce of 1 MiB, four rounds of
// each: 116.4-119.0 us with 32 KiB parts, 112.5-116.5 with 16, 110.8-117.0 with 8, 112.8-114.8
// with 4; a model in C that writes both places from the same registers was 1.5-3 us faster
// than 8 KiB parts.
constexpr int64_t kThroughBytes = 16 << 10;

int run_through(Ctx& c, const int32_t* in, char* const* addr, int nsrc, int64_t len,
                char* user, const Target* push, int npush) {
    int64_t es = int64_t(c.esize), step = std::max<int64_t>(1, kThroughBytes / es);
    char* part[65];
    for (int64_t off = 0; off < len; off += step) {
        int64_t n = std::min(step, len - off);
        for (int s = 0; s <= nsrc; ++s) part[s] = addr[s] + off * es;
        if (int rc = run_local(c, in, part, nsrc, n)) return rc;
        if (user) cx_copy_impl(user + off * es, part[0], size_t(n) * c.esize);
        if (int rc = put(c, push, npush, off * es, part[0], n)) return rc;
    }
    return CX_EXEC_OK;
}

// Where the piece of `ref` at chunk j (offset `lo` of `unit`; `at`: its offset in a user
// buffer) lies: in a peer's buffer published for use across processes, in my user buffer used
// in place, or in the window (a staging slot or a heap array).
Target locate(const Ctx& c, const int32_t* ref, int64_t j, int64_t unit, int64_t lo,
              int64_t at) {
    if (const char* remote = remote_of(c, ref)) return {const_cast<char*>(remote) + at, ref[0]};
    if (ref[0] == c.plan->rank && ref[1] < 2 && is_direct(c, ref[1], j))
        return {c.user[ref[1]] + at, -1};
    int slot = 3 * ref[0] + ref[1];
    return {c.ptr[slot] + (unit * c.stride[slot] + lo) * int64_t(c.esize), -1};
}

// Runs one instruction, split into pieces that stay inside one unit of every ref (units are not
// adjacent in the tiled layout) and in one place (see same_place).
int run_instr(Ctx& c, const int32_t* in) {
    const cx_exec_plan* p = c.plan;
    int64_t nch = p->nchunks, n = in[4], es = int64_t(c.esize);
    int nsrc = in[6];
    const int32_t* srcs = p->srcs + 4 * in[5];
    if (nsrc < 1 || nsrc > 64) return CX_EXEC_BADARG;
    const int32_t* refs[65];
    refs[0] = in + 1;
    for (int s = 0; s < nsrc; ++s) refs[s + 1] = srcs + 4 * s;
    for (int64_t k = 0; k < n;) {
        int64_t m = n - k;
        for (int s = 0; s <= nsrc; ++s) m = std::min<int64_t>(m, nch - (refs[s][2] + k) % nch);
        for (int s = 0; s <= nsrc; ++s) m = std::min(m, same_place(c, refs[s], k, m));
        char* addr[65];
        int rank[65];  // the peer whose process addr[s] is in, or -1: it is in mine
        bool any_remote = false;
        int64_t len = -1;
        char* through = nullptr;  // where the piece also goes in the user's output, if it does
        Target push[kMaxPush];    // where the fused pushed copies write it (the same chunks)
        bool remote_push = false;
        for (int s = 0; s <= nsrc; ++s) {
            int64_t j = refs[s][2] + k, unit = j / nch, i = j % nch;
            int64_t lo = chunk_lo(i, nch, c.tile_len), hi = chunk_lo(i + m, nch, c.tile_len);
            int64_t at = (unit * c.call->count + lo) * es;  // the piece's offset in a user buffer
            if (s == 0 && refs[0][0] == p->rank && refs[0][1] == 1 && is_through(c, j))
                through = c.user[1] + at;
            for (int q = 0; s == 0 && q < c.npush; ++q) {  // the same chunks of peers' outputs
                push[q] = locate(c, c.push_ref[q], j, unit, lo, at);
                remote_push |= push[q].rank >= 0;
            }
            Target t = locate(c, refs[s], j, unit, lo, at);
            addr[s] = t.addr;
            rank[s] = t.rank;
            any_remote |= t.rank >= 0;
            if (len < 0) len = hi - lo;
            else if (len != hi - lo) return CX_EXEC_BADARG;  // refs of unequal element length
        }
        if (len > 0 && remote_push && through) {  // rare: staged, written through
            if (int rc = run_through(c, in, addr, nsrc, len, through, push, 0)) return rc;
            if (int rc = put(c, push, c.npush, 0, addr[0], len)) return rc;
        } else if (len > 0 && (any_remote || remote_push)) {
            if (int rc = run_remote(c, in, addr, rank, nsrc, len, push, c.npush)) return rc;
        } else if (len > 0 && (through || c.npush)) {
            if (int rc = run_through(c, in, addr, nsrc, len, through, push, c.npush)) return rc;
        } else if (len > 0) {
            if (int rc = run_local(c, in, addr, nsrc, len)) return rc;
        }
        k += m;
    }
    return CX_EXEC_OK;
}

const int32_t* fusable_push(const Ctx& c, const int32_t* in, const int32_t* next) {
    return cx_fusable_push(in, next, c.plan->srcs, c.plan->rank);
}

int fail(Ctx& c, int status, int rank) {
    c.res->status = status;
    c.res->rank = rank;
    return status;
}

inline bool dep_met(const Ctx& c, const int32_t* d) {
    uint64_t want = (c.epoch << 32) | uint64_t(d[2] + 1);
    return load_acq(&c.win->ctl[d[0]]->lane_flag[d[1]][0]) >= want;
}

// Whether the next instruction of some unfinished lane has every dep met.
bool any_ready(const Ctx& c, const int* pc) {
    const cx_exec_plan* p = c.plan;
    for (int l = 0; l < p->nlanes; ++l) {
        if (pc[l] >= p->lane_off[l + 1]) continue;
        const int32_t* in = p->instrs + CX_IN_WORDS * pc[l];
        const int32_t* deps = p->deps + 3 * in[7];
        bool ok = true;
        for (int d = 0; d < in[8] && ok; ++d) ok = dep_met(c, deps + 3 * d);
        if (ok) return true;
    }
    return false;
}

int run_lanes(Ctx& c) {
    const cx_exec_plan* p = c.plan;
    int pc[CX_EXEC_MAX_LANES];
    for (int l = 0; l < p->nlanes; ++l) pc[l] = p->lane_off[l];
    cx_ctl* mine = c.win->ctl[p->rank];
    Waiter w(c.win, c.call->seq, c.deadline, c.res);
    for (;;) {
        bool progressed = false, left = false;
        for (int l = 0; l < p->nlanes; ++l) {
            for (; pc[l] < p->lane_off[l + 1]; ++pc[l]) {
                const int32_t* in = p->instrs + CX_IN_WORDS * pc[l];
                const int32_t* deps = p->deps + 3 * in[7];
                bool ok = true;
                for (int d = 0; d < in[8] && ok; ++d) ok = dep_met(c, deps + 3 * d);
                if (!ok) break;
                // The pushed copies that follow it run inside it.
                c.npush = 0;
                while (c.npush < kMaxPush && pc[l] + 1 + c.npush < p->lane_off[l + 1] &&
                       (c.push_ref[c.npush] =
                            fusable_push(c, in, in + CX_IN_WORDS * (1 + c.npush))))
                    ++c.npush;
                int rc = run_instr(c, in);
                int fused = c.npush;
                c.npush = 0;
                if (rc != CX_EXEC_OK) return w.fail(rc, c.fail_rank >= 0 ? c.fail_rank : p->rank);
                pc[l] += fused;
                int idx = pc[l] - p->lane_off[l];
                publish(c.win, &mine->lane_flag[l][0], (c.epoch << 32) | uint64_t(idx + 1));
                progressed = true;
            }
            if (pc[l] < p->lane_off[l + 1]) {
                left = true;
                c.res->lane = l;
                c.res->index = pc[l] - p->lane_off[l];
            }
        }
        if (!left) return CX_EXEC_OK;
        if (progressed) {
            w.reset();
        } else if (int rc = w.until([&] { return any_ready(c, pc); })) {
            return rc;
        }
    }
}

int wait_deps(Ctx& c, const int32_t* deps, int n) {
    Waiter w(c.win, c.call->seq, c.deadline, c.res);
    for (int d = 0; d < n; ++d)
        if (int rc = w.until([&] { return dep_met(c, deps + 3 * d); })) return rc;
    return CX_EXEC_OK;
}

int check_descriptors(Ctx& c) {
    const cx_exec_window* w = c.win;
    int slot = int(c.call->seq & 1);
    const uint64_t* mine = w->ctl[w->rank]->desc[slot];
    for (int r = 0; r < w->nranks; ++r)
        if (load_acq(&w->ctl[r]->desc[slot][1]) == kAbortedCall && r != w->rank)
            return fail(c, CX_EXEC_ABORTED, r);
    for (int r = 0; r < w->nranks; ++r)
        if (memcmp(mine, w->ctl[r]->desc[slot], kDescCompared * sizeof(uint64_t)) != 0)
            return fail(c, CX_EXEC_MISMATCH, r);
    for (int r = 0; r < w->nranks; ++r) {
        const uint64_t* d = w->ctl[r]->desc[slot];
        c.zero_copy |= (d[kDescHeap] | d[kDescHeap + 1]) != 0;
        c.cma_any |= (d[kDescCma] | d[kDescCma + 1]) != 0;
    }
    return CX_EXEC_OK;
}

int barrier(Ctx& c) {
    const cx_exec_window* w = c.win;
    publish(w, &w->ctl[w->rank]->ready, c.epoch);
    Waiter wt(c.win, c.call->seq, c.deadline, c.res);
    for (int i = 1; i < w->nranks; ++i) {
        wt.awaited = (w->rank + i) % w->nranks;
        const uint64_t* ready = &w->ctl[wt.awaited]->ready;
        if (int rc = wt.until([&] { return load_acq(ready) >= c.epoch; })) return rc;
    }
    return CX_EXEC_OK;
}

// Copies the chunks of this tile that are not used in place between the user's buffer and my
// staging slot, unit by unit, contiguous chunks in one copy.
void stage(Ctx& c, int buf, bool out) {
    const cx_exec_plan* p = c.plan;
    int64_t es = int64_t(c.esize), nch = p->nchunks;
    char* user = c.user[buf];
    char* slot = c.ptr[3 * p->rank + buf];
    int64_t stride = c.stride[3 * p->rank + buf];
    // Chunks used in place, and output chunks already written through, are not copied.
    auto skip = [&](int64_t j) { return is_direct(c, buf, j) || (out && is_through(c, j)); };
    for (int64_t u = 0; u < p->units[buf]; ++u) {
        for (int64_t i = 0; i < nch;) {
            if (skip(u * nch + i)) {
                ++i;
                continue;
            }
            int64_t e = i + 1;
            while (e < nch && !skip(u * nch + e)) ++e;
            int64_t lo = chunk_lo(i, nch, c.tile_len), hi = chunk_lo(e, nch, c.tile_len);
            char* uptr = user + (u * c.call->count + lo) * es;
            char* sptr = slot + (u * stride + lo) * es;
            if (out) cx_copy_impl(uptr, sptr, size_t(hi - lo) * c.esize);
            else cx_copy_impl(sptr, uptr, size_t(hi - lo) * c.esize);
            i = e;
        }
    }
}

void scale_output(Ctx& c) {
    const cx_exec_call* k = c.call;
    int64_t es = int64_t(c.esize);
    for (int64_t u = 0; u < c.plan->units[1]; ++u)
        cx_scale_impl((char*)k->user_out + (u * k->count + c.tile_off) * es, size_t(c.tile_len),
                      k->dtype, k->scale);
}

int run_tile(Ctx& c, bool first, bool last) {
    const cx_exec_call* k = c.call;
    place_buffers(c);
    if (c.user[0] && !c.all_direct[0]) stage(c, 0, false);
    if (int rc = barrier(c)) return rc;
    if (first) {
        if (int rc = check_descriptors(c)) return rc;
        place_buffers(c);  // now that every descriptor (heap offsets) is known
    }
    if (int rc = run_lanes(c)) return rc;
    // An output that peers read in place (heap, CMA) is scaled only once they all finished the
    // tile: they may still be copying it unscaled.
    bool shared_out = k->out_heap >= 0 || (k->cma_out && c.user[1]);
    if (k->user_out) {
        if (int rc = wait_deps(c, c.plan->fin_deps, c.plan->nfin)) return rc;
        if (c.user[1] && !c.all_direct[1]) stage(c, 1, true);
        if (k->scale != 1.0 && !shared_out) scale_output(c);
    }
    // Zero copy: peers read heap buffers in place, so nobody may return (and let its caller
    // reuse the buffer) before every rank has finished the tile. Buffers read across processes
    // are user buffers, tile by tile disjoint: only the last tile (or a scaling) must wait.
    bool scale_late = k->user_out && k->scale != 1.0 && shared_out;
    if (c.zero_copy || (c.cma_any && (last || scale_late)))
        if (int rc = wait_deps(c, c.plan->all_deps, c.plan->nall)) return rc;
    if (scale_late) scale_output(c);
    return CX_EXEC_OK;
}

// A peer that gave up on the communicator (a timeout, a signal, an error) returns to its
// caller, which may then rewrite or free the buffers this rank reads in place or across
// processes. Ranks that still had work of their own left in the call may have finished it
// without waiting on that peer again: they check, once every read is done, that no peer gave
// up meanwhile, and fail the call instead of returning data read from a buffer in use again.
int peers_stayed(Ctx& c) {
    __atomic_thread_fence(__ATOMIC_ACQUIRE);  // every read of this call before the loads below
    for (int r = 0; r < c.win->nranks; ++r) {
        if (r == c.win->rank || !(load_acq(&c.win->ctl[r]->abort_word) & CX_ABORT_FATAL)) continue;
        c.res->rank = r;
        return CX_EXEC_ABORTED;
    }
    return CX_EXEC_OK;
}

}  // namespace

extern "C" int cx_exec_run(const cx_exec_plan* plan, const cx_exec_window* win,
                           const cx_exec_call* call, cx_exec_result* res) {
    res->status = CX_EXEC_OK;
    res->rank = -1;
    res->epochs_used = 0;
    res->lane = res->index = -1;
    if (plan->nranks != win->nranks || plan->rank != win->rank || plan->nranks > kMaxRanks ||
        plan->nlanes > CX_EXEC_MAX_LANES || call->tile_count <= 0 || call->count < 0)
        return to_cx_status(res->status = CX_EXEC_BADARG);
    Ctx c;  // not value-initialised: ptr/stride/remote (16 KiB) are set per tile (place_buffers)
    c.zero_copy = c.cma_any = false;
    c.fail_rank = -1;
    c.npush = 0;
    c.plan = plan;
    c.win = win;
    c.call = call;
    c.res = res;
    c.esize = cx_dtype_size(call->dtype);
    if (c.esize == 0) return to_cx_status(res->status = CX_EXEC_BADARG);
    // The call descriptor peers compare after the first barrier (published by its release).
    uint64_t* desc = win->ctl[win->rank]->desc[call->seq & 1];
    desc[0] = call->seq;
    desc[1] = uint64_t(call->coll);
    desc[2] = uint64_t(call->dtype);
    desc[3] = uint64_t(call->op);
    desc[4] = uint64_t(call->count);
    desc[5] = uint64_t(call->root);
    desc[kDescHeap] = uint64_t(call->in_heap + 1);   // 0: staged; else heap offset + 1
    desc[kDescHeap + 1] = uint64_t(call->out_heap + 1);
    desc[kDescCma] = call->cma_in && call->in_heap < 0 ? uint64_t(uintptr_t(call->user_in)) : 0;
    desc[kDescCma + 1] =
        call->cma_out && call->out_heap < 0 ? uint64_t(uintptr_t(call->user_out)) : 0;
    int64_t start = call->deadline_ns ? call->deadline_ns - call->timeout_ns : now_ns();
    int64_t deadline = start + call->timeout_ns;
    c.deadline = deadline;
    begin_call(start);
    int64_t ntiles = call->count == 0 ? 1 : (call->count + call->tile_count - 1) / call->tile_count;
    for (int64_t t = 0; t < ntiles; ++t) {
        c.epoch = call->epoch + uint64_t(t);
        c.tile_off = t * call->tile_count;
        c.tile_len = std::min(call->tile_count, call->count - c.tile_off);
        res->epochs_used = uint64_t(t + 1);
        if (int rc = run_tile(c, t == 0, t == ntiles - 1)) return to_cx_status(res->status = rc);
    }
    return to_cx_status(res->status = peers_stayed(c));
}
