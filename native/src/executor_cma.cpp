// Cross-memory attach (CMA): a rank reads a peer's user buffer with process_vm_readv.
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
#include <sys/uio.h>
#endif

namespace cx_exec {

int cma_read(int64_t pid, const void* remote, void* local, size_t nbytes) {
#ifdef __linux__
    char* dst = static_cast<char*>(local);
    char* src = const_cast<char*>(static_cast<const char*>(remote));
    while (nbytes) {
        iovec l{dst, nbytes}, r{src, nbytes};
        ssize_t got = process_vm_readv(pid_t(pid), &l, 1, &r, 1, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return errno;
        if (got == 0) return EFAULT;  // a short read is followed by a failing one; stop here
        dst += got;
        src += got;
        nbytes -= size_t(got);
    }
    return 0;
#else
    (void)pid, (void)remote, (void)local, (void)nbytes;
    return ENOSYS;
#endif
}

}  // namespace cx_exec

extern "C" int cx_exec_cma_read(long long pid, const void* remote, void* local,
                                long long nbytes) {
    if (nbytes < 0 || (nbytes && (!remote || !local))) return EINVAL;
    return cx_exec::cma_read(pid, remote, local, size_t(nbytes));
}
