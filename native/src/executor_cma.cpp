// Cross-memory attach (CMA): a rank reads a peer's user buffer with process_vm_readv, and
// writes a peer's output with process_vm_writev (a copy pushed by the rank that computed it,
// collectx/schedule/push.py).
//
// Staging a buffer that peers read costs its owner a copy into the window before the peers can
// read it there; and an output that peers read is written to the window, then copied out. With
// CMA the owner publishes the buffer's address instead and a reader copies straight from it,
// through the kernel, into its own memory: one copy where there were two. Linux allows it
// between processes of one user unless a ptrace policy (Yama) forbids it; window.py probes every
// pair of ranks before a communicator uses it.

#include "cx_executor.h"

#include <errno.h>

#ifdef __linux__
#include <sys/prctl.h>
#include <sys/uio.h>
#endif

namespace cx_exec {

// process_vm_readv (write == false) or process_vm_writev of nbytes, retried across short
// transfers and signals. 0 or the errno.
static int cma_move(int64_t pid, char* remote, char* local, size_t nbytes, bool write) {
#ifdef __linux__
    while (nbytes) {
        iovec l{local, nbytes}, r{remote, nbytes};
        ssize_t got = write ? process_vm_writev(pid_t(pid), &l, 1, &r, 1, 0)
                            : process_vm_readv(pid_t(pid), &l, 1, &r, 1, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return errno;
        if (got == 0) return EFAULT;  // a short transfer is followed by a failing one; stop here
        local += got;
        remote += got;
        nbytes -= size_t(got);
    }
    return 0;
#else
    (void)pid, (void)remote, (void)local, (void)nbytes, (void)write;
    return ENOSYS;
#endif
}

int cma_read(int64_t pid, const void* remote, void* local, size_t nbytes) {
    return cma_move(pid, const_cast<char*>(static_cast<const char*>(remote)),
                    static_cast<char*>(local), nbytes, false);
}

int cma_write(int64_t pid, void* remote, const void* local, size_t nbytes) {
    return cma_move(pid, static_cast<char*>(remote),
                    const_cast<char*>(static_cast<const char*>(local)), nbytes, true);
}

}  // namespace cx_exec

extern "C" int cx_exec_cma_read(long long pid, const void* remote, void* local,
                                long long nbytes) {
    if (nbytes < 0 || (nbytes && (!remote || !local))) return EINVAL;
    return cx_exec::cma_read(pid, remote, local, size_t(nbytes));
}

// Yama's ptrace_scope 1 (Ubuntu's default) lets a process read only the memory of its own
// descendants, so sibling ranks cannot use CMA until each names who may read it. Only one reader
// pid can be named, and a rank has several peers, hence "any process of this user" (Open MPI's
// shared-memory transport does the same). 0 undoes it.
extern "C" int cx_exec_allow_peer_reads(int allow) {
#if defined(__linux__) && defined(PR_SET_PTRACER)
    unsigned long who = allow ? (unsigned long)PR_SET_PTRACER_ANY : 0UL;
    return prctl(PR_SET_PTRACER, who, 0UL, 0UL, 0UL) == 0 ? 0 : errno;
#else
    (void)allow;
    return ENOSYS;
#endif
}
