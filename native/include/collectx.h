/* collectx C ABI: the one header cffi reads (collectx/_native.py strips the preprocessor lines and
 * the extern "C" guard lines, then passes the rest to ffi.cdef). So: plain declarations and
 * enums only, no #define constants, no inline code, no C++ types.
 *
 * Every entry point returns an int status: CX_OK (0) or a negative cx_status code.
 * Counts (n) are in elements of the given dtype; sizes (nbytes) are in bytes.
 */
#ifndef COLLECTX_H
#define COLLECTX_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  CX_INT8 = 0,
  CX_UINT8 = 1,
  CX_INT32 = 2,
  CX_INT64 = 3,
  CX_FLOAT16 = 4,
  CX_BFLOAT16 = 5,
  CX_FLOAT32 = 6,
  CX_FLOAT64 = 7,
  CX_NUM_DTYPES = 8
} cx_dtype;

/* CX_AVG reduces like CX_SUM; the caller divides once at the end with cx_scale (1/n), so partial
 * sums from several steps are never divided twice. */
typedef enum {
  CX_SUM = 0,
  CX_PROD = 1,
  CX_MIN = 2,
  CX_MAX = 3,
  CX_AVG = 4,
  CX_NUM_OPS = 5
} cx_op;

typedef enum {
  CX_OK = 0,
  CX_ERR_DTYPE = -1,      /* dtype code outside cx_dtype */
  CX_ERR_OP = -2,         /* op code outside cx_op */
  CX_ERR_ARG = -3,        /* null pointer, k < 1, too many sources, bad factor, small buffer */
  CX_ERR_CUDA = -4,       /* a CUDA runtime call failed */
  CX_ERR_NO_CUDA = -5,    /* the library was built without CUDA objects */
  CX_ERR_NOMEM = -6,      /* an allocation or mapping failed */
  CX_ERR_TIMEOUT = -7,    /* a wait on a peer ran past its deadline */
  CX_ERR_PEER = -8,       /* a peer failed or aborted */
  CX_ERR_INTERNAL = -9,   /* a broken invariant inside the library */
  CX_ERR_INTERRUPTED = -10 /* a signal came while a collective waited (cx_exec_watch_signals) */
} cx_status;

/* The most sources one cx_cuda_reduce call takes (they travel as a kernel parameter). */
typedef enum { CX_MAX_CUDA_SRCS = 32 } cx_limits;

/* Library version as major*10000 + minor*100 + patch. */
int cx_version(int* version);

/* "key=value;key=value" text: version, compiler, isa (chosen at run time), cuda_objects (0/1),
 * cuda_archs. Returns CX_ERR_ARG (with the text truncated) when len is too small. */
int cx_build_info(char* buf, size_t len);

/* Size in bytes of one element of dtype, or 0 for an unknown code. */
size_t cx_dtype_bytes(int dtype);

/* dst[0:nbytes] = src[0:nbytes]. dst == src is a no-op; other overlaps are the caller's error. */
int cx_copy(void* dst, const void* src, size_t nbytes);

/* dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[k-1][i], for i < n, evaluated left to right.
 * k == 1 is a copy. dst may be srcs[0] exactly (accumulate in place); any other overlap between
 * dst and a source is the caller's error. float16/bfloat16 accumulate in float32 and round once.
 * Integers wrap around on overflow, like numpy. */
int cx_reduce(void* dst, const void* const* srcs, int k, size_t n, int dtype, int op);

/* Floats: dst[i] *= factor. Integers: factor must be 1/d for an integer d >= 1 and
 * dst[i] /= d, truncating toward zero (NCCL's integer average). */
int cx_scale(void* dst, size_t n, int dtype, double factor);

/* Number of CUDA devices usable by this library: 0 without CUDA objects, driver or device.
 * Never fails and never aborts on a machine without a GPU. */
int cx_cuda_available(void);

/* Device-pointer versions of cx_copy / cx_reduce, queued on stream (a cudaStream_t, NULL for the
 * legacy default stream). srcs is a host array of k <= CX_MAX_CUDA_SRCS device pointers. The
 * calls return once the work is queued; synchronize the stream before reading dst. */
int cx_cuda_copy(void* dst, const void* src, size_t nbytes, void* stream);
int cx_cuda_reduce(void* dst, const void* const* srcs, int k, size_t n, int dtype, int op,
                   void* stream);

/* ---- CPU executor (collectx/runtime; native/src/executor.cpp, layout in cx_executor.h) ----- */

/* Why a collective stopped: cx_exec_result.status (cx_exec_run returns the matching cx_status). */
typedef enum {
  CX_EXEC_OK = 0,
  CX_EXEC_TIMEOUT = 1,    /* the deadline passed while waiting (CX_ERR_TIMEOUT) */
  CX_EXEC_PEER_DEAD = 2,  /* result.rank's process is gone (CX_ERR_PEER) */
  CX_EXEC_ABORTED = 3,    /* result.rank set its abort word or aborted this call (CX_ERR_PEER) */
  CX_EXEC_MISMATCH = 4,   /* result.rank's call descriptor differs from ours (CX_ERR_PEER) */
  CX_EXEC_BADARG = 5,     /* malformed plan or call (CX_ERR_ARG) */
  CX_EXEC_KERNEL = 6,     /* a copy/reduce kernel refused its arguments (CX_ERR_INTERNAL) */
  CX_EXEC_CMA = 7,        /* reading result.rank's buffer across processes failed (CX_ERR_PEER) */
  CX_EXEC_INTERRUPTED = 8 /* a watched signal came while the call had waited a while; this rank
                             raised its fatal abort word (CX_ERR_INTERRUPTED) */
} cx_exec_status;

/* Control block at the start of every rank's window; layout in cx_executor.h. */
typedef struct cx_ctl cx_ctl;

/* One rank's slice of a schedule, flattened once per schedule.
 * instrs: 9 int32 per instruction: op (0 copy, 1 reduce), dst rank, dst buf (0 input, 1 output,
 *   2 scratch), dst chunk, dst count, first source, number of sources, first dep, number of deps.
 * srcs: 4 int32 per source ref (rank, buf, chunk, count); deps: 3 int32 (rank, lane, index).
 * lane_off[nlanes + 1]: instruction range of each of this rank's lanes.
 * fin_deps: instructions (of any rank) after which this rank's output holds the result. */
typedef struct {
  int nranks;
  int rank;
  int nchunks;
  int nlanes;
  const int* lane_off;
  const int* instrs;
  const int* srcs;
  const int* deps;
  const int* fin_deps;
  int nfin;
  const int* all_deps;    /* the last instruction of every lane of every rank (zero-copy fence) */
  int nall;
  int units[3];           /* units per rank of input, output, scratch (scratch: max over ranks) */
} cx_exec_plan;

/* Every rank's window, mapped in this process. */
typedef struct {
  int nranks;
  int rank;
  cx_ctl** ctl;           /* [nranks] control blocks */
  char** data;            /* [nranks] start of staging set 0 */
  long long set_bytes;    /* bytes of one staging set (there are two) */
  int spin;               /* busy polls before yielding the CPU, when spin_ns is 0 */
  char** p2p;             /* [nranks] point-to-point area: counters, then one slot per peer */
  long long p2p_slot_bytes;  /* bytes of one peer's slot (two halves, double-buffered) */
  char** heap;            /* [nranks] start of each rank's heap (Communicator.empty arrays) */
  long long spin_ns;      /* > 0: busy-poll this long before sleeping (then `spin` is unused);
                             0: poll `spin` times, then yield (ranks outnumber the CPUs) */
} cx_exec_window;

/* One collective call of this rank. */
typedef struct {
  int dtype;
  int op;
  long long count;        /* elements per unit of the whole message */
  long long tile_count;   /* elements per unit per tile (equal on every rank) */
  const void* user_in;    /* NULL: nothing to stage */
  void* user_out;         /* NULL: nothing to copy out */
  int in_private;         /* 1: no peer touches this rank's input; read user_in in place */
  int out_private;        /* 1: no peer touches this rank's output; write user_out in place */
  double scale;           /* != 1.0: multiply the output once complete (avg) */
  unsigned long long seq;       /* call sequence number; descriptor slot = seq & 1 */
  unsigned long long epoch;     /* epoch of the first tile; tile t uses epoch + t */
  long long deadline_ns;  /* CLOCK_MONOTONIC deadline (cx_exec_now_ns); 0: now + timeout_ns */
  long long timeout_ns;
  int coll;               /* collective code and root, written with seq, dtype, op and count */
  int root;               /* into this rank's call descriptor before the first barrier */
  long long in_heap;      /* byte offset of user_in in this rank's heap, or -1: peers then read */
  long long out_heap;     /* it in place (zero copy); likewise user_out, or -1 */
  /* Per chunk (unit * nchunks + chunk) of user_in / user_out: 1 = used in place in the user's
   * buffer, 0 = staged in the window (chunks some peer touches). NULL: in_private / out_private
   * decide for every chunk. */
  const unsigned char* in_direct;
  const unsigned char* out_direct;
  /* 1: peers read this rank's user_in / user_out across processes (process_vm_readv) instead of
   * from the window, so neither is staged; only for buffers no peer writes (peer_use.py). */
  int cma_in;
  int cma_out;
  /* Per chunk of user_out, like out_direct: 1 = a chunk staged in the window that this rank's
   * instructions also write through to user_out as they compute it, so it is not copied out
   * at the end of the tile (FlatPlan.through_mask). NULL: none. Ignored with cma_in/cma_out. */
  const unsigned char* out_through;
} cx_exec_call;

typedef struct {
  int status;             /* cx_exec_status */
  int rank;               /* the peer involved, or -1 */
  unsigned long long epochs_used;  /* tiles begun, also on failure */
  int lane;               /* on timeout: the lane and instruction that was waiting */
  int index;
} cx_exec_result;

/* Runs this rank's part of one collective, every tile, with the GIL released by cffi. */
int cx_exec_run(const cx_exec_plan* plan, const cx_exec_window* win, const cx_exec_call* call,
                cx_exec_result* res);
/* Point-to-point: send nbytes to rank peer / receive them from it, through the sender's slot for
 * that peer, in pieces of half a slot. Send returns once the last piece is in the window (the
 * buffer is reusable). Both sides must pass the same nbytes (CX_EXEC_MISMATCH otherwise). */
int cx_exec_send(const cx_exec_window* win, int peer, const void* buf, long long nbytes,
                 long long deadline_ns, cx_exec_result* res);
int cx_exec_recv(const cx_exec_window* win, int peer, void* buf, long long nbytes,
                 long long deadline_ns, cx_exec_result* res);
/* Watch SIGINT and SIGTERM where the process handles them with a function (Python does for
 * SIGINT): the function still runs, and a collective that has waited at least a second when the
 * signal comes, or waits that long after it, stops with CX_EXEC_INTERRUPTED instead of waiting
 * out its deadline. Idempotent; call again after a handler is replaced. Returns how many of the
 * two signals are watched. */
int cx_exec_watch_signals(void);
/* CLOCK_MONOTONIC in nanoseconds, the clock of cx_exec_call.deadline_ns. */
long long cx_exec_now_ns(void);
/* 1 if the process exists and is not a zombie, else 0. */
int cx_exec_pid_alive(long long pid);
/* Copies nbytes at `remote` in process pid's memory to `local` (one copy through the kernel,
 * Linux cross-memory attach). Returns 0, or the errno that stopped it (EPERM: not allowed to
 * read that process; ESRCH: it is gone; ENOSYS: not Linux). */
int cx_exec_cma_read(long long pid, const void* remote, void* local, long long nbytes);
/* allow = 1: any process of this user may read this one across processes (and ptrace it), even
 * under Yama's ptrace_scope 1; 0: only what the system policy allows again. Returns 0, or the
 * errno (EINVAL: no Yama in this kernel, nothing to lift; ENOSYS: not Linux). */
int cx_exec_allow_peer_reads(int allow);

/* ---- end CPU executor ------------------------------------------------------------------------ */

/* ---- CUDA executor (native/cuda/executor.cu, window.cu; layout in cx_cuda_exec.h) ---------- */
/* Present only in builds with CUDA objects (cuda_objects=1 in cx_build_info); the Python layer
 * checks for the symbols before use. Every call returns a cx_status and never aborts on a machine
 * without a driver or device; cx_cuda_last_error tells what the CUDA runtime said. */

/* The last CUDA failure seen by this thread, as "call: cuda error text". */
int cx_cuda_last_error(char* buf, size_t len);
int cx_cuda_device_count(int* count);
int cx_cuda_set_device(int device);
int cx_cuda_get_device(int* device);
int cx_cuda_device_synchronize(void);
/* PCI bus id text ("0000:07:00.0") of a device: which ranks share one GPU. */
int cx_cuda_device_pci_bus_id(int device, char* buf, int len);
/* Streaming multiprocessors of a device: how many blocks of every rank on it run at once. */
int cx_cuda_device_sms(int device, int* count);
int cx_cuda_can_access_peer(int device, int peer, int* can);
/* Enables access from the current device to peer's memory; already enabled counts as success. */
int cx_cuda_enable_peer_access(int peer);
int cx_cuda_malloc(void** ptr, size_t nbytes);
int cx_cuda_free(void* ptr);
/* Page-locked host memory (for status words copied back by the stream). */
int cx_cuda_host_alloc(void** ptr, size_t nbytes);
int cx_cuda_host_free(void* ptr);
/* Queued on stream (NULL: legacy default stream); memcpy infers the direction (unified
 * addressing), so it serves D2D, H2D and D2H. */
int cx_cuda_memset(void* ptr, int value, size_t nbytes, void* stream);
int cx_cuda_memcpy(void* dst, const void* src, size_t nbytes, void* stream);
/* CUDA IPC: a 64-byte handle of an allocation's base (cudaMalloc'd), opened in another process
 * with lazy peer access. A process cannot open its own handles: use the pointer there. */
int cx_cuda_ipc_get_handle(void* base, unsigned char* handle64);
int cx_cuda_ipc_open(const unsigned char* handle64, void** base);
int cx_cuda_ipc_close(void* base);
/* Allocation base, size and device of any device pointer (for sub-allocated tensors). */
int cx_cuda_pointer_base(const void* ptr, void** base, size_t* size, int* device);
int cx_cuda_stream_create(void** stream);
int cx_cuda_stream_destroy(void* stream);
int cx_cuda_stream_synchronize(void* stream);
/* interprocess=1: cudaEventInterprocess | cudaEventDisableTiming (required for IPC events). */
int cx_cuda_event_create(void** event, int interprocess);
int cx_cuda_event_destroy(void* event);
int cx_cuda_event_record(void* event, void* stream);
/* Makes stream wait for event on the device (no host wait). */
int cx_cuda_stream_wait_event(void* stream, void* event);
/* CX_OK once the event's work is done, 1 while it is pending. */
int cx_cuda_event_query(void* event);
int cx_cuda_event_synchronize(void* event);
int cx_cuda_ipc_get_event_handle(void* event, unsigned char* handle64);
int cx_cuda_ipc_open_event_handle(const unsigned char* handle64, void** event);

/* A cx_exec_plan's arrays copied to device memory once (opaque). */
typedef struct cx_cuda_plan cx_cuda_plan;

/* The exact int32 image cx_cuda_plan_upload copies to the device: a 16-word header (nranks,
 * rank, nchunks, nlanes, ninstrs, nsrcs, ndeps, nfin, units[3], then the word offsets of
 * lane_off, instrs, srcs, deps, fin_deps) followed by those five arrays in the cx_exec_plan
 * encoding, unchanged. Host code, no GPU needed; *needed gets the word count (call with
 * cap 0 to size the buffer). CX_ERR_ARG for a malformed plan or a too small buffer. */
int cx_cuda_plan_pack(const cx_exec_plan* plan, int* out, long long cap, long long* needed);
int cx_cuda_plan_upload(const cx_exec_plan* plan, cx_cuda_plan** out);
int cx_cuda_plan_free(cx_cuda_plan* plan);
/* Bytes of the control block at the start of every CUDA window (staging sets follow it). */
int cx_cuda_ctl_bytes(long long* nbytes);

/* Failure record of one call, written by the kernel into the caller's window and copied to
 * status_host by the stream after the last tile. status is a cx_exec_status. */
typedef struct {
  int status;
  int rank;
  int lane;
  int index;
} cx_cuda_exec_status;

/* One collective call of this rank, queued whole (every tile) on a stream. */
typedef struct {
  const cx_cuda_plan* plan;
  void* self_window;      /* this rank's window base (device pointer, this process) */
  void* const* d_windows; /* device array [nranks]: every rank's window base mapped here */
  long long set_bytes;    /* bytes of one staging set (there are two) */
  int coll;               /* descriptor: collective code, compared across ranks on tile 0 */
  int root;
  int dtype;
  int op;
  long long count;        /* elements per unit of the whole message */
  long long tile_count;   /* elements per unit per tile (equal on every rank) */
  const void* user_in;    /* device pointers; NULL: nothing to stage / copy out */
  void* user_out;
  int in_private;         /* 1: no peer reads this rank's input: the kernel reads user_in */
  int out_private;        /* 1: no peer writes this rank's output: the kernel writes user_out */
  double scale;           /* != 1.0: multiply the output once complete (avg) */
  unsigned long long seq;
  unsigned long long epoch;     /* epoch of the first tile; tile t uses epoch + t */
  long long timeout_ns;   /* per tile, measured on the GPU's global timer */
  int threads;            /* threads per block, at most 512; 0: 512 */
  cx_cuda_exec_status* status_host; /* pinned host record, or NULL */
  int channels;           /* blocks per lane, each running the lane over its share of every
                           * tile (equal on every rank); 0: 1 */
  int lane_stride;        /* the most lanes any rank of the schedule has (equal on every rank);
                           * channels * lane_stride <= 504; 0: 64 */
  int direct;             /* 1 (equal on every rank): ranks address each other's user buffers
                           * (one process), so nothing is staged and tiles hold scratch only */
  int copy_input;         /* direct calls: 1 to read the input from a copy made first on the
                           * stream (cudaMallocAsync), where it overlaps the output in a way
                           * the schedule's order does not make safe */
  int device;             /* the rank's GPU: made current first if it is not */
  void* done_event;       /* NULL, or a CUDA event recorded on the stream after the call */
  cx_cuda_exec_status* capture_status; /* pinned record of calls captured into a CUDA graph,
                           * which every replay writes (status_host is per eager call) */
  int captured;           /* out: 1 when the stream was capturing (the call is in the graph) */
} cx_cuda_exec_args;

/* Queues this rank's part of a collective on stream and returns without waiting. */
int cx_cuda_exec_launch(const cx_cuda_exec_args* args, void* stream);
/* Before a call: *state is 2 when stream is capturing a graph (then the event is not asked),
 * else 0 when event's work is done (or event is NULL) and 1 while it runs. */
int cx_cuda_exec_poll(void* event, void* stream, int* state);
/* CPU emulation of cx_cuda_exec_launch, for tests without a GPU: the same interpreter code
 * compiled for the host, one thread per lane (one "thread" per block), on host-memory windows
 * (self_window, d_windows and the user pointers are host pointers; args->plan is not used).
 * Returns when this rank's call is done; the status record is filled as on the GPU. */
int cx_cuda_exec_emulate(const cx_exec_plan* plan, const cx_cuda_exec_args* args);
/* Tiles (epochs) a call of count elements per unit uses: the caller advances its epoch by this. */
int cx_cuda_exec_ntiles(long long count, long long tile_count, long long* ntiles);
/* Loads every collectx kernel into the current device's context now. Call it before a rank's
 * first collective: with lazy module loading a kernel's first launch may wait for the context to
 * go idle, and ranks sharing a context (threads of one process) spin on each other. */
int cx_cuda_preload(void);
/* This rank rejects call seq: peers fail it with CX_EXEC_ABORTED instead of waiting. */
int cx_cuda_exec_abort(void* self_window, unsigned long long seq, unsigned long long epoch,
                       void* stream);

/* ---- end CUDA executor ----------------------------------------------------------------------- */

/* ---- flow simulator (planner) ---------------------------------------------------------------
 * The event loop of collectx/schedule/simulate.py with max-min fair link sharing, in native code
 * (same numbers as the Python loop). Arrays named *_off are CSR offsets with n + 1 entries.
 * Sizes in bytes, times in microseconds, capacities in bytes per microsecond. */
typedef struct cx_sim_graph {
  int nres;                   /* resources (directed links, node memories) */
  const double* capacity;     /* [nres] */
  int nclasses;               /* route classes: flows with the same resources */
  const int* class_off;       /* [nclasses + 1] */
  const int* class_res;       /* resources of each class's route, non-empty */
  int ntasks;                 /* tasks: one instruction or one engine call */
  const int* part_off;        /* [ntasks + 1]: the flows a task queues when it starts */
  const double* part_bytes;
  const int* part_class;
  const double* part_latency; /* delay before the flow starts moving bytes */
  const int* member_off;      /* [ntasks + 1]: the graph nodes each task completes */
  const int* members;
  int nnodes;                 /* schedule instructions (happens-before graph nodes) */
  const int* node_task;       /* [nnodes]: the task a node belongs to */
  const int* succ_off;        /* [nnodes + 1] */
  const int* succs;
  const int* npreds;          /* [nnodes]: predecessors each node waits for */
} cx_sim_graph;

/* Runs the tasks until no flow is left: *time_us is the last completion, start_order[0 ..
 * *nstarted) the tasks in the order they started (a task never started sits in a cycle).
 * CX_ERR_ARG for out-of-range ids or missing arrays. */
int cx_sim_fairshare(const cx_sim_graph* graph, double* time_us, int* start_order,
                     int* nstarted);

/* cx_sim_fairshare, given up once the run is sure to end after give_up_us: some link still
 * has more bytes to carry than it can before then. *given_up says so (1, else 0); *time_us is
 * then that lower bound on the last completion and start_order the tasks started so far. */
int cx_sim_fairshare_within(const cx_sim_graph* graph, double give_up_us, double* time_us,
                            int* start_order, int* nstarted, int* given_up);

/* cx_sim_fairshare_within that also stops once *stop is non-zero (another thread sets it when
 * the result is no longer wanted; read every few dozen events): *given_up is then 2 and
 * *time_us the time reached, which says nothing of the last completion. stop may be NULL. */
int cx_sim_fairshare_stoppable(const cx_sim_graph* graph, double give_up_us,
                               const volatile int* stop, double* time_us, int* start_order,
                               int* nstarted, int* given_up);

/* cx_sim_fairshare_stoppable that also writes when each task finished to finish_us[0 ..
 * ntasks) (a task never finished keeps what was there); finish_us may be NULL. Planners read
 * which of a schedule's trees finished last from it. */
int cx_sim_fairshare_timed(const cx_sim_graph* graph, double give_up_us,
                           const volatile int* stop, double* time_us, int* start_order,
                           int* nstarted, int* given_up, double* finish_us);

/* ---- end flow simulator ---------------------------------------------------------------------- */

#ifdef __cplusplus
}
#endif

#endif /* COLLECTX_H */
