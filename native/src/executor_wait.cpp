// Waiting on peers: spin, then sleep on a futex doorbell, and every millisecond check that the
// wait can still end.
//
// Tests run 4-8 ranks on 2 cores, and benchmarks share their cores with other work, so a waiting
// rank must give its core to the peer it waits for, yet resume as soon as that peer publishes. It
// spins for `win->spin_ns` when every rank has a core (`win->spin` polls when oversubscribed),
// then sleeps on its doorbell (FUTEX_WAIT, at most a millisecond at a time): a peer that
// publishes a word while we sleep rings it (see cx_executor.h). Fixed-length sleeps, used before, woke up to
// 100 us late once per tile; a sched_yield phase between spinning and sleeping measured no better
// (often worse: on a loaded machine a yield hands the core to other work for a whole slice).
// Every millisecond or so it checks the peers' liveness (pid), their abort words, the deadline,
// and whether a watched signal came (see "Signals" below).
//
// Oversubscribed ranks (more ranks than CPUs: the runtime then sets spin_ns 0, `spin` 50) are the
// exception: the peer a rank waits for is usually queued on the same CPU, and a futex sleep both
// costs a wakeup and lets the load balancer move work around. There a wait's first kYieldNs of
// sleeping are sched_yield() calls (polling the doorbell): the queued peer runs at
// once and a rank stays runnable. Measured with 4 ranks on 2 cores: 8 B allreduce 244-323 us ->
// 70-101 us, 64 KiB 383 -> 166 us, 1 MiB 807 -> 417 us (with every rank having a CPU a yield only
// hands it to unrelated work, so the phase is skipped there). Two more costs were found there
// with perf and removed: each wait restarted the health-check clock, so every call read each
// peer's /proc stat; and every publish paid a futex-wake syscall for peers that were only
// yielding. With both gone, 4 ranks on 2 cores: 8 B allreduce 85-91 us -> 17-19 us.

#include "cx_executor.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

namespace cx_exec {

namespace {

constexpr long kSleepNs = 1000000;  // longest single sleep: the health-check period
constexpr int64_t kYieldNs = 200000;  // the oversubscribed yield phase (see the top comment)

bool pid_exists(int64_t pid) { return !(kill(pid_t(pid), 0) != 0 && errno == ESRCH); }

// Shared (not FUTEX_PRIVATE) futexes: the words live in a MAP_SHARED segment of several processes.
void futex_wait(uint32_t* word, uint32_t expected, long ns) {
    timespec ts{0, ns};
    syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake(uint32_t* word) { syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0); }

// Signals. A rank blocked in a wait runs no Python, so Python's handler for Ctrl-C only sets a
// flag, and the KeyboardInterrupt came once the call returned: at its deadline (COLLECTX_TIMEOUT,
// 300 s by default) when a peer never arrives, e.g. two ranks that both receive first. The
// library chains its own handler in front of the process's: it counts the signal, then calls
// the previous handler as the kernel would have. A wait gives up on a counted signal only once
// its call has waited kInterruptAfterNs: a call that finishes sooner returns normally and the
// program's handler sees the signal then, so a handler that shuts down gracefully (finish the
// step, save, exit) still gets working collectives.
constexpr int64_t kInterruptAfterNs = 1000000000;
constexpr int kWatched[2] = {SIGINT, SIGTERM};
struct sigaction g_previous[2];
uint64_t g_signals;  // how many watched signals came; only atomic operations touch it

thread_local int64_t t_call_start;     // when this thread's current call began
thread_local uint64_t t_call_signals;  // g_signals then

void counted(int sig, siginfo_t* info, void* ctx) {
    __atomic_fetch_add(&g_signals, 1, __ATOMIC_RELAXED);  // lock-free: async-signal-safe
    const struct sigaction& prev = g_previous[sig == kWatched[0] ? 0 : 1];
    if (prev.sa_flags & SA_SIGINFO) prev.sa_sigaction(sig, info, ctx);
    else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) prev.sa_handler(sig);
}

bool is_ours(const struct sigaction& a) {
    return (a.sa_flags & SA_SIGINFO) && a.sa_sigaction == counted;
}

// Chains `counted` in front of each watched signal's handler when that handler is a function
// and not already ours (Python's signal.signal() replaces it: call again to re-chain).
int watch_signals() {
    int watched = 0;
    for (int i = 0; i < 2; ++i) {
        struct sigaction cur;
        if (sigaction(kWatched[i], nullptr, &cur) != 0) continue;
        if (is_ours(cur)) {
            ++watched;
            continue;
        }
        bool function = (cur.sa_flags & SA_SIGINFO) ||
                        (cur.sa_handler != SIG_DFL && cur.sa_handler != SIG_IGN);
        if (!function) continue;
        struct sigaction mine = cur;  // same mask and flags (SA_ONSTACK, SA_RESTART...)
        mine.sa_flags |= SA_SIGINFO;
        mine.sa_sigaction = counted;
        g_previous[i] = cur;
        if (sigaction(kWatched[i], &mine, nullptr) == 0) ++watched;
    }
    return watched;
}

// Re-chaining costs two system calls, a fifth of a 2-rank send/recv round trip when every call
// did it; calls re-chain at most every kRewatchNs (begin_call), and a wait re-chains on its
// own every 10 ms (Waiter::check). A handler installed since is so chained within 10 ms of any
// wait: long before the second after which a wait gives up on a signal.
constexpr int64_t kRewatchNs = 100000000;
int64_t g_watched_at;  // when a call last re-chained (atomic operations only)
int g_watched;         // what it found

int rewatch(int64_t t) {
    int64_t last = __atomic_load_n(&g_watched_at, __ATOMIC_RELAXED);
    if (last != 0 && t - last < kRewatchNs) return __atomic_load_n(&g_watched, __ATOMIC_RELAXED);
    int watched = watch_signals();
    __atomic_store_n(&g_watched, watched, __ATOMIC_RELAXED);
    __atomic_store_n(&g_watched_at, t, __ATOMIC_RELAXED);
    return watched;
}

// Whether a watched signal came since this call began, and the call has waited long enough.
bool interrupted(int64_t t) {
    return __atomic_load_n(&g_signals, __ATOMIC_RELAXED) != t_call_signals &&
           t - t_call_start >= kInterruptAfterNs;
}

}  // namespace

void begin_call(int64_t start_ns) {
    t_call_start = start_ns;
    t_call_signals = __atomic_load_n(&g_signals, __ATOMIC_RELAXED);
    rewatch(start_ns);  // Ctrl-C ends a wait that went on, whatever handler is new since
}

int64_t now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return int64_t(ts.tv_sec) * 1000000000ll + ts.tv_nsec;
}

// kill(pid, 0) succeeds on zombies, and a SIGKILLed rank stays a zombie until its parent reaps
// it, so a live-looking pid is also checked for state 'Z' in /proc.
bool pid_alive(int64_t pid) {
    if (pid <= 0) return true;
    if (!pid_exists(pid)) return false;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
    FILE* f = fopen(path, "r");
    if (!f) return true;  // no procfs: trust kill()
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char* rp = strrchr(buf, ')');
    return !(rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X'));
}

// `asleep` is kWatching while a waiter polls its doorbell (the oversubscribed yield phase) and
// kInFutex once it may block in FUTEX_WAIT: only then does a publish pay for the wake syscall
// (a shared futex's wake pins the page: most of an oversubscribed 8-byte allreduce went there).
// The publisher bumps the doorbell and only then re-reads `asleep`; the waiter raises kInFutex,
// fences, and FUTEX_WAIT compares the doorbell with the value it armed with. So either the waiter
// sees the bump (and does not block) or the publisher sees kInFutex (and wakes it).
constexpr uint32_t kWatching = 1, kInFutex = 2;

void ring(const cx_exec_window* win) {
    __atomic_thread_fence(__ATOMIC_SEQ_CST);  // our publish before the loads of `asleep`
    for (int r = 0; r < win->nranks; ++r) {
        cx_ctl* c = win->ctl[r];
        if (r == win->rank || !__atomic_load_n(&c->asleep, __ATOMIC_RELAXED)) continue;
        __atomic_fetch_add(&c->doorbell, 1u, __ATOMIC_SEQ_CST);  // a full barrier on x86 too
        if (__atomic_load_n(&c->asleep, __ATOMIC_SEQ_CST) == kInFutex) futex_wake(&c->doorbell);
    }
}

uint32_t Waiter::arm() {
    cx_ctl* me = win->ctl[win->rank];
    uint32_t bell = __atomic_load_n(&me->doorbell, __ATOMIC_ACQUIRE);
    __atomic_store_n(&me->asleep, kWatching, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);  // `asleep` up before the caller re-checks
    return bell;
}

// The yield phase of an oversubscribed rank: its first kYieldNs of sleeping in one wait are
// sched_yield() calls that poll the doorbell. The budget spans the whole wait, not only its first
// sleep: a wait for several peers (a barrier, a one-step reduce) is rung by each of them in turn,
// and a rank that fell into FUTEX_WAIT after the first ring made every later publisher pay a
// wake-up. With 4 ranks on 2 cores an 8 B allreduce took 13.4-14.4 us with the phase at the
// first sleep only and 4.3-4.9 us with it spanning the wait (allgather 10.4-12.6 -> 5.5-6.8,
// broadcast 12.6-13.3 -> 3.8-4.0; 8 ranks allreduce 29.9 -> 14.7). True when the doorbell rang
// meanwhile (the caller re-checks its condition).
bool Waiter::yielded(uint32_t bell) {
    if (win->spin_ns > 0) return false;
    int64_t t = now_ns();
    if (yield_end == 0) yield_end = t + kYieldNs;
    const uint32_t* db = &win->ctl[win->rank]->doorbell;
    while (t < yield_end) {
        sched_yield();
        if (__atomic_load_n(db, __ATOMIC_ACQUIRE) != bell) return true;
        t = now_ns();
    }
    return false;
}

void Waiter::sleep(uint32_t bell) {
    if (yielded(bell)) return;
    long ns = kSleepNs;
    if (deadline > 0) {
        int64_t left = deadline - now_ns();
        if (left < ns) ns = left > 1000 ? long(left) : 1000;
    }
    cx_ctl* me = win->ctl[win->rank];
    __atomic_store_n(&me->asleep, kInFutex, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);  // peers that publish from now on wake us
    futex_wait(&me->doorbell, bell, ns);
}

void Waiter::disarm() { __atomic_store_n(&win->ctl[win->rank]->asleep, 0u, __ATOMIC_RELAXED); }

// Liveness, abort words and deadline, at most once a millisecond (pid state from /proc every
// ten); what it finds is reported by until() only if the wait still cannot end.
void Waiter::check() {
    int64_t t = now_ns();
    if (t < next_check) return;
    next_check = t + kSleepNs;
    bool proc = t >= next_proc;
    if (proc) {
        next_proc = t + 10 * kSleepNs;
        watch_signals();
    }
    pending = health(t, proc);
}

// Liveness first: when a peer dies, every survivor should name the dead rank, not the first
// survivor that noticed it and raised its abort word.
int Waiter::health(int64_t t, bool check_proc) {
    for (int r = 0; r < win->nranks; ++r) {
        if (r == win->rank) continue;
        int64_t pid = int64_t(load_acq(&win->ctl[r]->pid));
        if (!(check_proc ? pid_alive(pid) : pid_exists(pid))) {
            pending_rank = r;
            return CX_EXEC_PEER_DEAD;
        }
    }
    for (int r = 0; r < win->nranks; ++r) {
        if (r == win->rank) continue;
        uint64_t a = load_acq(&win->ctl[r]->abort_word);
        if ((a & CX_ABORT_FATAL) || a == seq + 1) {
            pending_rank = r;
            return CX_EXEC_ABORTED;
        }
    }
    // A peer that closed the communicator finished every call it will make: a wait for it
    // alone that has not ended never will (one for several peers may still end: others' work)
    if (awaited >= 0 && (load_acq(&win->ctl[awaited]->abort_word) & CX_ABORT_CLOSED)) {
        pending_rank = awaited;
        return CX_EXEC_ABORTED;
    }
    pending_rank = -1;
    if (interrupted(t)) {
        // Peers waiting on this rank give up at once (Python poisons the communicator too, but
        // the KeyboardInterrupt may come before that code runs).
        publish(win, &win->ctl[win->rank]->abort_word, CX_ABORT_FATAL | uint64_t(win->rank));
        return CX_EXEC_INTERRUPTED;
    }
    return t > deadline ? CX_EXEC_TIMEOUT : CX_EXEC_OK;
}

int Waiter::fail(int status, int rank) {
    res->status = status;
    res->rank = rank;
    return status;
}

}  // namespace cx_exec

extern "C" long long cx_exec_now_ns(void) { return cx_exec::now_ns(); }

extern "C" int cx_exec_pid_alive(long long pid) { return cx_exec::pid_alive(pid) ? 1 : 0; }

// Chains the library's counting handler in front of SIGINT's and SIGTERM's (see watch_signals);
// returns how many of the two it watches.
extern "C" int cx_exec_watch_signals(void) { return cx_exec::rewatch(cx_exec::now_ns()); }
