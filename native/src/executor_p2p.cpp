// Point-to-point send/recv between two ranks of a communicator, over the sender's window.
//
// Every rank's window ends with a p2p area: one 128-byte line pair per peer (what I published
// to that peer, what I consumed from it), then one slot per peer, split into two halves. A
// message is cut into pieces of half a slot. Piece p (counted over the pair's whole history,
// from 1) goes to half p % 2 of the sender's slot for the receiver; the sender waits until the
// receiver has consumed piece p - 2 (so at most two pieces are in flight), copies, and publishes
// sent = p; the receiver waits for sent >= p, copies out and publishes acked = p. Counters only
// grow, so nothing is ever reset. The first piece carries the message length so a size mismatch
// is reported instead of desynchronising the pair.

#include "cx_executor.h"
#include "cx_kernels.h"

#include <algorithm>

using namespace cx_exec;

namespace {

// An abort word can never equal this + 1, so only fatal aborts end a p2p wait.
constexpr uint64_t kNoCall = ~0ull - 1;

struct Line {
    uint64_t sent;    // pieces published to the peer
    uint64_t nbytes[2];  // message length, by half: set with a message's first piece
    uint64_t pad0[5];
    uint64_t acked;   // pieces consumed from the peer
    uint64_t pad1[7];
};
static_assert(sizeof(Line) == 128, "window.py sizes the p2p header as nranks * 128 bytes");

Line* line(const cx_exec_window* w, int owner, int peer) {
    return reinterpret_cast<Line*>(w->p2p[owner]) + peer;
}

char* slot(const cx_exec_window* w, int owner, int peer) {
    int64_t header = (int64_t(w->nranks) * 128 + 4095) / 4096 * 4096;
    return w->p2p[owner] + header + int64_t(peer) * w->p2p_slot_bytes;
}

int start(const cx_exec_window* w, int peer, long long nbytes, cx_exec_result* res) {
    begin_call(now_ns());
    res->status = CX_EXEC_OK;
    res->rank = peer;
    res->epochs_used = 0;
    res->lane = res->index = -1;
    bool ok = w->p2p && peer >= 0 && peer < w->nranks && peer != w->rank && nbytes >= 0 &&
              w->p2p_slot_bytes >= 128;
    return ok ? CX_EXEC_OK : (res->status = CX_EXEC_BADARG);
}

}  // namespace

extern "C" int cx_exec_send(const cx_exec_window* w, int peer, const void* buf, long long nbytes,
                            long long deadline_ns, cx_exec_result* res) {
    if (int rc = start(w, peer, nbytes, res)) return to_cx_status(rc);
    Line* mine = line(w, w->rank, peer);
    const Line* theirs = line(w, peer, w->rank);
    int64_t half = w->p2p_slot_bytes / 2;
    int64_t pieces = std::max<int64_t>(1, (nbytes + half - 1) / half);
    Waiter wt(w, kNoCall, deadline_ns, res);
    wt.awaited = peer;
    for (int64_t k = 0; k < pieces; ++k) {
        uint64_t p = mine->sent + 1;
        if (int rc = wt.until([&] { return load_acq(&theirs->acked) + 2 >= p; }))
            return to_cx_status(rc);
        wt.reset();
        int64_t off = k * half, len = std::min<int64_t>(half, nbytes - off);
        if (len > 0) cx_copy_impl(slot(w, w->rank, peer) + (p & 1) * half, (const char*)buf + off,
                                  size_t(len));
        if (k == 0) mine->nbytes[p & 1] = uint64_t(nbytes);
        publish(w, &mine->sent, p);
    }
    return CX_OK;
}

extern "C" int cx_exec_recv(const cx_exec_window* w, int peer, void* buf, long long nbytes,
                            long long deadline_ns, cx_exec_result* res) {
    if (int rc = start(w, peer, nbytes, res)) return to_cx_status(rc);
    Line* mine = line(w, w->rank, peer);
    const Line* theirs = line(w, peer, w->rank);
    int64_t half = w->p2p_slot_bytes / 2;
    int64_t pieces = std::max<int64_t>(1, (nbytes + half - 1) / half);
    Waiter wt(w, kNoCall, deadline_ns, res);
    wt.awaited = peer;
    for (int64_t k = 0; k < pieces; ++k) {
        uint64_t p = mine->acked + 1;
        if (int rc = wt.until([&] { return load_acq(&theirs->sent) >= p; })) return to_cx_status(rc);
        wt.reset();
        if (k == 0 && theirs->nbytes[p & 1] != uint64_t(nbytes)) {
            res->epochs_used = theirs->nbytes[p & 1];  // the sender's length, for the error message
            return to_cx_status(wt.fail(CX_EXEC_MISMATCH, peer));
        }
        int64_t off = k * half, len = std::min<int64_t>(half, nbytes - off);
        if (len > 0) cx_copy_impl((char*)buf + off, slot(w, peer, w->rank) + (p & 1) * half,
                                  size_t(len));
        publish(w, &mine->acked, p);
    }
    return CX_OK;
}
