/* CPU executor: runs one rank's part of a planned collective over shared-memory windows.
 *
 * Internal header: the window's control-block layout, shared with collectx/runtime/window.py (which
 * addresses the same words by byte offset). The entry points and their structs are declared in
 * collectx.h (section "CPU executor") so cffi sees them.
 *
 * Window layout (per rank, one POSIX shm segment each, see collectx/runtime/window.py):
 *   [0, CX_CTL_BYTES)          control block, struct cx_ctl below
 *   [CX_CTL_BYTES, +2*set)     two staging sets (double buffer by epoch parity), each holding
 *                              input | output | scratch slots of one tile
 *
 * Flags are 64-bit words (epoch << 32 | instruction index + 1) published with release stores and
 * read with acquire loads, so a schedule replays call after call without any reset.
 *
 * Waiting: a rank spins briefly on the word it needs, then sleeps on its own doorbell (a futex
 * word in its control block) after raising `asleep`; every publish (cx_exec::publish) rings the doorbell of each peer whose `asleep` is up. A store, a full fence, then a load on both sides
 * (Dekker) means a publish cannot slip between a sleeper's last check and its sleep unseen.
 */
#ifndef CX_EXECUTOR_H
#define CX_EXECUTOR_H

#include <stdint.h>
#include <stddef.h>

#include "collectx.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CX_EXEC_MAX_LANES 128
#define CX_EXEC_DESC_WORDS 10
#define CX_CTL_BYTES 16384

#define CX_ABORT_FATAL (1ull << 63) /* abort_word bit: the communicator is unusable */
#define CX_ABORT_CLOSED (1ull << 62) /* abort_word bit: the rank closed it, makes no more calls */

/* Control block at offset 0 of every rank's segment; each hot word on its own cache line. */
struct cx_ctl {
    uint64_t magic;           /* set by the owner once the block is initialised */
    uint64_t pid;             /* owner's pid, for liveness checks (kill(pid, 0)) */
    uint64_t base;            /* where the owner maps this segment: read by window.py's probe */
    uint64_t pad0[5];
    uint64_t ready;           /* epoch whose tile this rank has staged (barrier word) */
    uint64_t pad1[7];
    uint64_t abort_word;      /* 0, seq+1 of an aborted call, CX_ABORT_FATAL|rank or
                                 CX_ABORT_CLOSED|rank */
    uint64_t pad2[7];
    uint64_t p2p_pad[8];
    /* Call descriptors, slot = seq parity: seq, collective, dtype, op, count, root (compared
     * across ranks), heap offset + 1 of the input and output (0: not in the heap), and the
     * address in this process of a user input / output that peers read across processes
     * (cma_read), 0 where they are staged. */
    uint64_t desc[2][CX_EXEC_DESC_WORDS];
    uint32_t doorbell;        /* futex word: bumped by a peer that publishes while I sleep */
    uint32_t asleep;          /* 0 running, 1 polling its doorbell, 2 may block on it (futex) */
    int64_t next_check_ns;    /* owner only: when its waits next check the peers' health, */
    int64_t next_proc_ns;     /* and their /proc state (kept across calls, see Waiter) */
    uint64_t pad3[73];
    uint64_t lane_flag[CX_EXEC_MAX_LANES][8]; /* [lane][0] used; one cache line per lane */
};


#ifdef __cplusplus
}  // extern "C"

// Shared by the executor's translation units (executor.cpp, executor_p2p.cpp).
namespace cx_exec {

inline uint64_t load_acq(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline void store_rel(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

int64_t now_ns();
bool pid_alive(int64_t pid);

// cx_status for a cx_exec_status, so entry points follow the library-wide convention.
inline int to_cx_status(int exec_status) {
    switch (exec_status) {
        case CX_EXEC_OK: return CX_OK;
        case CX_EXEC_TIMEOUT: return CX_ERR_TIMEOUT;
        case CX_EXEC_BADARG: return CX_ERR_ARG;
        case CX_EXEC_KERNEL: return CX_ERR_INTERNAL;
        case CX_EXEC_INTERRUPTED: return CX_ERR_INTERRUPTED;
        default: return CX_ERR_PEER;
    }
}

// Marks the start of a call on this thread (at start_ns, CLOCK_MONOTONIC): a watched signal
// interrupts the call's waits only once the call has waited kInterruptAfterNs
// (executor_wait.cpp).
void begin_call(int64_t start_ns);

// Copies nbytes from `remote` in process pid to `local` (process_vm_readv). 0 or the errno.
int cma_read(int64_t pid, const void* remote, void* local, size_t nbytes);
// Copies nbytes from `local` to `remote` in process pid (process_vm_writev). 0 or the errno.
int cma_write(int64_t pid, void* remote, const void* local, size_t nbytes);

// Rings the doorbell of every peer asleep now. Call after publishing (store_rel) a word peers
// may wait on; costs a fence and one load per peer when nobody sleeps.
void ring(const cx_exec_window* win);

inline void publish(const cx_exec_window* win, uint64_t* p, uint64_t v) {
    store_rel(p, v);
    ring(win);
}

// Backoff plus the periodic health check (peers alive, abort words, deadline) of one wait site.
// Use as: if (int rc = w.until([&] { return condition; })) return rc;
struct Waiter {
    const cx_exec_window* win;
    uint64_t seq;             // call sequence number: an abort word of seq + 1 aborts this call
    int64_t deadline;
    cx_exec_result* res;
    int polls = 0;
    int64_t spin_end = 0;     // when spinning by time (win->spin_ns): the end, once known
    int64_t yield_end = 0;    // oversubscribed: when this wait's yield phase ends, once known
    // The health-check clock lives in this rank's control block, not here: a Waiter lasts one
    // wait, and restarting the clock each time made every wait of an oversubscribed rank (which
    // reaches check() after a few polls) read each peer's /proc stat, ~20 us a call.
    int64_t& next_check;
    int64_t& next_proc;
    int pending = 0;          // failure seen by the last health check, not yet reported
    int pending_rank = -1;
    // The one peer the wait is for, where only that peer can end it (a barrier, send/recv), or
    // -1: a wait on a peer that closed the communicator then fails instead of timing out.
    int awaited = -1;

    Waiter(const cx_exec_window* w, uint64_t s, int64_t d, cx_exec_result* r)
        : win(w), seq(s), deadline(d), res(r), next_check(w->ctl[w->rank]->next_check_ns),
          next_proc(w->ctl[w->rank]->next_proc_ns) {}
    void reset() { polls = 0; spin_end = yield_end = 0; pending = 0; }
    int fail(int status, int rank);

    // Returns CX_EXEC_OK once cond() holds, or the failure (dead peer, abort, deadline) seen
    // while it did not. A failure is reported only if cond(), re-checked after the health
    // check, still fails: a peer may publish its last flag and exit right after our check.
    template <class Cond>
    int until(Cond&& cond) {
        while (!cond()) {
            if (pending) return fail(pending, pending_rank);
            if (keep_spinning()) {
                relax();
                continue;
            }
            uint32_t bell = arm();
            if (!cond()) sleep(bell);
            disarm();
            check();
        }
        return CX_EXEC_OK;
    }

private:
    static void relax() {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        asm volatile("yield");
#endif
    }
    // Whether to poll once more before sleeping: win->spin polls, or for win->spin_ns (the
    // clock read every 64 polls, so a poll stays a few loads).
    bool keep_spinning() {
        ++polls;
        if (win->spin_ns <= 0) return polls < win->spin;
        if (polls & 63) return true;
        int64_t t = now_ns();
        if (spin_end == 0) spin_end = t + win->spin_ns;
        return t < spin_end;
    }
    uint32_t arm();           // raise `asleep` (then a full fence); returns the doorbell value
    void sleep(uint32_t bell);
    bool yielded(uint32_t bell);
    void disarm();
    void check();             // health check, about once a millisecond
    int health(int64_t t, bool check_proc);
};

}  // namespace cx_exec

extern "C" {
#endif
#ifdef __cplusplus
}
#endif
#endif
