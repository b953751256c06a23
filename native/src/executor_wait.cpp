// Waiting on peers: spin, yield, sleep, and every millisecond check that the wait can still end.
//
// Tests run 4-8 ranks on 2 cores, so a waiting rank must give its core to the peer it waits for:
// it spins `win->spin` polls (large when every rank has a core, small when oversubscribed), then
// sched_yield()s, then nanosleeps. About every millisecond it checks the peers' liveness (pid),
// their abort words and the deadline.

#include "cx_executor.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

namespace cx_exec {

namespace {

constexpr uint64_t kAbortFatal = 1ull << 63;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

bool pid_exists(int64_t pid) { return !(kill(pid_t(pid), 0) != 0 && errno == ESRCH); }

}  // namespace

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

// A failure is reported only if the caller, having re-checked its condition once more, still
// cannot proceed: a peer may publish its last flag and exit (or die) right after our check,
// and what it published before dying is still good.
int Waiter::wait() {
    if (pending) return fail(pending, pending_rank);
    ++polls;
    if (polls < win->spin) {
        cpu_relax();
        return CX_EXEC_OK;
    }
    if (polls < win->spin + 2000) {
        sched_yield();
    } else {
        timespec ts{0, 50000};
        nanosleep(&ts, nullptr);
    }
    if ((polls & 15) != 0 && polls > win->spin + 64) return CX_EXEC_OK;
    int64_t t = now_ns();
    if (t < next_check) return CX_EXEC_OK;
    next_check = t + 1000000;
    bool proc = t >= next_proc;
    if (proc) next_proc = t + 10000000;
    pending = health(t, proc);
    return CX_EXEC_OK;
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
        if ((a & kAbortFatal) || a == seq + 1) {
            pending_rank = r;
            return CX_EXEC_ABORTED;
        }
    }
    pending_rank = -1;
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
