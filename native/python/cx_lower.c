/* collectx._fastpath.lower_words: a tree packing's schedule written straight as packed words.
 *
 * Why it exists: a tree plan lowers a dozen or more candidate packings to 10^4-10^5 transfers
 * each, only to simulate them. Built as Python objects (an item tuple, a Ref or two and a
 * scratch chunk from ScheduleBuilder.fresh per transfer), lowering was a third to a half of a
 * DGX-1 plan's time, all of it under the GIL. Here the transfers are C structs from the shares
 * to the words, and the work runs without the GIL, so two candidates lower at once.
 *
 * collectx/schedule/treesched.py is the reference: TreeEmitter's broadcast, reduce, self_copy
 * and flush(packed=True), with the builder's fresh(). This mirrors them step for step, so the
 * words are byte for byte those of Schedule.to_packed for the schedule the Python emitter
 * builds (tests/test_packed_candidates.py checks both ways):
 *   - items are appended in the same order, with the same double arithmetic for their times,
 *     then dealt in order of (time, sequence), which is Python's stable sort by time;
 *   - a lane key is kept as (kind, node, share number, turn), which is equal exactly when the
 *     Python tuple keys are (the reduction's key names the children of its node, and a node
 *     has one set of children in a tree); a key's lane on a rank is the number of keys first
 *     used on that rank before it, modulo the rank's lanes (TreeEmitter.lane);
 *   - scratch and host chunks are handed out as ScheduleBuilder.fresh hands them out, and the
 *     builder's unit counts are updated in place;
 *   - one staging copy serves every receiver of the same (Ref, token), as _stage_up's dict.
 *
 * lower_words(nranks, nchunks, lanes, turns, codes, scratch, host, phases) -> bytes
 *   codes: (copy op, reduce op, scratch buffer, host buffer) indices of the words;
 *   scratch, host: the builder's units per rank (lists, updated);
 *   phases, in order, each one of
 *     (0, rank, dst, src)                           a rank-local copy (self_copy);
 *     (1, shares, contrib, result)                  a reduction (reduce);
 *     (2, shares, src, dst, after)                  a broadcast; after: it waits for the last
 *                                                   reduction's roots (broadcast(after=done));
 *   a Ref is (rank, buffer index, chunk, count); contrib, result, src and dst are ChunkRefs
 *   (buffer index, per_root); a share is (root, ((parent, child), ...) top-down, pieces as
 *   ((first chunk, chunks), ...), per edge whether it is staged down, per edge whether up[,
 *   the node its broadcast keeps pace with, -1 for none: Share.pace]).
 * Malformed phases raise TypeError or ValueError; nothing is written to the lists then.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cx_lower.h"
#include "cx_unpack.h"

#define CX_LOWER_MAX (1LL << 40) /* |chunk|, count, per_root: their sums stay exact */
#define CX_LOWER_UNITS (1LL << 31) /* nchunks, units reserved: a unit's first chunk is exact */

typedef struct {
  int64_t rank, buf, chunk, count;
} LRef;

/* Lane key kinds, one per key shape of TreeEmitter. */
enum { K_SELF = 1, K_DOWN, K_DOWN_HOST, K_HOST_UP, K_HOST_DOWN, K_UP, K_UP_HOST };

typedef struct {
  double t;
  int64_t rank, key, op, src, nsrc, tok, ntok; /* src, tok: offsets into Low.srcs, Low.toks */
  LRef dst;
} Item;

/* Open addressing from up to 6 int64 words to an int64 value. */
typedef struct {
  int64_t k[6];
  int64_t v;
} Entry;

typedef struct {
  Entry* e;
  char* used;
  int64_t cap, n;
} Map;

typedef struct {
  int64_t *data, n, cap;
} Vec;

typedef struct {
  int64_t root, nedges, npieces, *edges, *pieces; /* edges: p, c pairs; pieces: j, k pairs */
  char *down, *up;                                /* per edge: staged down, staged up */
  int64_t pace;                                   /* the node a broadcast keeps pace with */
} LShare;

typedef struct {
  int64_t kind, rank, nshares, a_buf, a_per, b_buf, b_per, after;
  LRef dst, src;
  LShare* shares;
} Phase;

struct Lane;

typedef struct {
  int64_t nranks, nchunks, lanes, turns, copy, reduce, bufs[2]; /* bufs: scratch, host */
  Item* items;
  int64_t nitems, cap_items;
  LRef* srcs;
  int64_t nsrcs, cap_srcs;
  Vec toks;
  int64_t* reserved[2]; /* per rank: units reserved (the builder's _scratch, _host) */
  int64_t** nexts[2];   /* per rank, nchunks long once used: the next unit of each index */
  Vec* units[2];        /* per rank: first chunk of each unit fresh() took */
  Map keys, staged, done;
  Vec staged_val, done_tok; /* staged: host chunk (4 words) and token; done: token */
  double* done_time;
  int64_t cap_done_time;
  /* per node, for the piece being lowered: its token, time and Ref, and the piece (stamp) */
  int64_t *tok, *stamp, now; /* stamp: the piece (numbered across shares) a node's state is of */
  double* time;
  LRef* ref;
  struct Lane* lane; /* per rank * lanes: the words dealt to each lane */
  int64_t* nlanes;   /* per rank: lanes used */
  int nomem;
  const char* bad; /* a malformed tree: what was wrong */
} Low;

/* ---- containers -------------------------------------------------------------------------- */

static int grow(void** p, int64_t* cap, int64_t need, size_t size) {
  if (need <= *cap) return 0;
  int64_t c = *cap ? *cap : 64;
  while (c < need) c *= 2;
  void* q = realloc(*p, (size_t)c * size);
  if (q == NULL) return -1;
  *p = q, *cap = c;
  return 0;
}

static int push(Vec* v, int64_t x) {
  if (grow((void**)&v->data, &v->cap, v->n + 1, sizeof(int64_t))) return -1;
  v->data[v->n++] = x;
  return 0;
}

static uint64_t hash6(const int64_t* k) {
  uint64_t h = 0x9E3779B97F4A7C15ull;
  for (int i = 0; i < 6; ++i) {
    h ^= (uint64_t)k[i] + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0xBF58476D1CE4E5B9ull;
  }
  return h ^ (h >> 31);
}

/* The entry of ``key`` (6 words): found, or added with v = -1. NULL when out of memory. */
static Entry* map_at(Map* m, const int64_t* key) {
  if (2 * (m->n + 1) > m->cap) {
    Map big = {calloc((size_t)(m->cap ? 2 * m->cap : 256), sizeof(Entry)),
               calloc((size_t)(m->cap ? 2 * m->cap : 256), 1), m->cap ? 2 * m->cap : 256, 0};
    if (big.e == NULL || big.used == NULL) {
      free(big.e), free(big.used);
      return NULL;
    }
    for (int64_t i = 0; i < m->cap; ++i) {
      if (!m->used[i]) continue;
      uint64_t at = hash6(m->e[i].k) & (uint64_t)(big.cap - 1);
      while (big.used[at]) at = (at + 1) & (uint64_t)(big.cap - 1);
      big.e[at] = m->e[i], big.used[at] = 1, big.n++;
    }
    free(m->e), free(m->used);
    *m = big;
  }
  uint64_t at = hash6(key) & (uint64_t)(m->cap - 1);
  while (m->used[at] && memcmp(m->e[at].k, key, sizeof m->e[at].k))
    at = (at + 1) & (uint64_t)(m->cap - 1);
  if (!m->used[at]) {
    memcpy(m->e[at].k, key, sizeof m->e[at].k);
    m->e[at].v = -1, m->used[at] = 1, m->n++;
  }
  return &m->e[at];
}

static void map_free(Map* m) { free(m->e), free(m->used); }

/* ---- emitting ---------------------------------------------------------------------------- */

/* The id of lane key (kind, a, number, turn); -1 when out of memory. */
static int64_t key_id(Low* L, int64_t kind, int64_t a, int64_t number, int64_t turn) {
  int64_t k[6] = {kind, a, number, turn, 0, 0};
  Entry* e = map_at(&L->keys, k);
  if (e == NULL) return L->nomem = 1, -1;
  if (e->v < 0) e->v = L->keys.n - 1;
  return e->v;
}

/* TreeEmitter._add: item (t, rank, key, op, dst, srcs, tokens); its seq, -1 out of memory. */
static int64_t add(Low* L, double t, int64_t rank, int64_t key, int64_t op, LRef dst,
                   const LRef* srcs, int64_t nsrc, const int64_t* toks, int64_t ntok) {
  if (key < 0 || grow((void**)&L->items, &L->cap_items, L->nitems + 1, sizeof(Item)) ||
      grow((void**)&L->srcs, &L->cap_srcs, L->nsrcs + nsrc, sizeof(LRef)))
    return L->nomem = 1, -1;
  Item* it = &L->items[L->nitems];
  *it = (Item){t, rank, key, op, L->nsrcs, nsrc, L->toks.n, ntok, dst};
  memcpy(&L->srcs[L->nsrcs], srcs, (size_t)nsrc * sizeof(LRef));
  L->nsrcs += nsrc;
  for (int64_t i = 0; i < ntok; ++i)
    if (push(&L->toks, toks[i])) return L->nomem = 1, -1;
  return L->nitems++;
}

/* ScheduleBuilder.fresh(("scratch", "host")[kind], rank, like): a run of rank's buffer no
 * earlier call handed out, as long as ``like`` and at its chunk index; 0, -1 out of memory. */
static int fresh(Low* L, int kind, int64_t rank, LRef like, LRef* out) {
  int64_t n = L->nchunks, i = ((like.chunk % n) + n) % n, k;
  int64_t** nexts = &L->nexts[kind][rank];
  if (*nexts == NULL && (*nexts = calloc((size_t)n, sizeof(int64_t))) == NULL)
    return L->nomem = 1, -1;
  if (like.count == 1) {
    k = (*nexts)[i]++;
  } else { /* a run holds each index it covers */
    int64_t end = i + like.count < n ? i + like.count : n;
    k = (*nexts)[i];
    for (int64_t q = i; q < end; ++q) k = (*nexts)[q] > k ? (*nexts)[q] : k;
    for (int64_t q = i; q < end; ++q) (*nexts)[q] = k + 1;
  }
  Vec* units = &L->units[kind][rank];
  while (units->n <= k)
    if (push(units, L->reserved[kind][rank]++ * n)) return L->nomem = 1, -1;
  *out = (LRef){rank, L->bufs[kind], units->data[k] + i, like.count};
  return 0;
}

/* TreeEmitter._stage_up: ``sender`` copies ``ref`` into a fresh chunk of its host buffer for
 * ``receiver``, once per (ref, token); that chunk and the copy's seq. 0, -1 out of memory. */
static int stage_up(Low* L, double t, int64_t number, int64_t turn, int64_t sender,
                    int64_t receiver, LRef ref, int64_t token, LRef* hop, int64_t* seq) {
  int64_t k[6] = {ref.rank, ref.buf, ref.chunk, ref.count, token, 0};
  Entry* e = map_at(&L->staged, k);
  if (e == NULL) return L->nomem = 1, -1;
  if (e->v < 0) {
    int64_t at = L->staged_val.n;
    if (fresh(L, 1, sender, ref, hop)) return -1;
    *seq = add(L, t, sender, key_id(L, K_HOST_UP, receiver, number, turn), L->copy, *hop, &ref,
               1, &token, 1);
    if (*seq < 0 || push(&L->staged_val, hop->rank) || push(&L->staged_val, hop->buf) ||
        push(&L->staged_val, hop->chunk) || push(&L->staged_val, hop->count) ||
        push(&L->staged_val, *seq))
      return L->nomem = 1, -1;
    e = map_at(&L->staged, k); /* the map may have moved while adding */
    e->v = at;
  }
  const int64_t* v = &L->staged_val.data[e->v];
  *hop = (LRef){v[0], v[1], v[2], v[3]};
  *seq = v[4];
  return 0;
}

static LRef chunk_ref(int64_t v, int64_t buf, int64_t per_root, int64_t root, int64_t j,
                      int64_t k) {
  return (LRef){v, buf, root * per_root + j, k};
}

/* Node v's state for the piece being lowered (the dicts ready and partial of the Python loops). */
static void reach(Low* L, int64_t v, int64_t token, double time, LRef ref) {
  L->tok[v] = token, L->time[v] = time, L->ref[v] = ref, L->stamp[v] = L->now;
}

static int reached(Low* L, int64_t v) {
  if (L->stamp[v] == L->now) return 1;
  L->bad = "a tree edge leaves a node before an edge reaches it (edges must run top-down)";
  return 0;
}

/* Share.lag: the depth of the share's pace node in its tree (0: none, or the root). */
static int64_t pace_lag(const LShare* s) {
  if (s->pace < 0 || s->pace == s->root) return 0;
  int64_t depth = 0, node = s->pace;
  for (int64_t q = s->nedges - 1; q >= 0; --q) /* edges run top-down: climb to the root */
    if (s->edges[2 * q + 1] == node) node = s->edges[2 * q], ++depth;
  return node == s->root ? depth : 0;
}

static int broadcast_pieces(Low* L, const Phase* ph, int64_t number, const LShare* s, int64_t m,
                            double step, int64_t lag, int64_t* paced_tok, double* paced_time);

/* TreeEmitter._broadcast_share for share ``number`` of phase ``ph``. */
static int broadcast_share(Low* L, const Phase* ph, int64_t number, const LShare* s) {
  int64_t m = s->npieces, lag = pace_lag(s) * L->turns;
  double step = 1.0 / (double)m;
  int64_t* paced_tok = lag ? malloc((size_t)(m + 1) * sizeof(int64_t)) : NULL;
  double* paced_time = lag ? malloc((size_t)(m + 1) * sizeof(double)) : NULL;
  if (lag && (!paced_tok || !paced_time)) {
    free(paced_tok), free(paced_time);
    return L->nomem = 1, -1;
  }
  int rc = broadcast_pieces(L, ph, number, s, m, step, lag, paced_tok, paced_time);
  free(paced_tok), free(paced_time);
  return rc;
}

/* broadcast_share's loop; paced_tok, paced_time: per piece, the item that brought it to the
 * pace node (lag > 0). */
static int broadcast_pieces(Low* L, const Phase* ph, int64_t number, const LShare* s, int64_t m,
                            double step, int64_t lag, int64_t* paced_tok, double* paced_time) {
  for (int64_t i = 0; i < m; ++i) {
    int64_t j = s->pieces[2 * i], k = s->pieces[2 * i + 1], turn = i % L->turns;
    int64_t token = -1;
    double start = ((double)i + 0.5) / (double)m;
    int64_t at[6] = {s->root, j, 0, 0, 0, 0};
    Entry* e = ph->after ? map_at(&L->done, at) : NULL;
    if (ph->after && e == NULL) return L->nomem = 1, -1;
    if (e != NULL && e->v >= 0) token = L->done_tok.data[e->v], start = L->done_time[e->v];
    L->now++;
    reach(L, s->root, token, start, chunk_ref(s->root, ph->a_buf, ph->a_per, s->root, j, k));
    for (int64_t q = 0; q < s->nedges; ++q) {
      int64_t p = s->edges[2 * q], c = s->edges[2 * q + 1], seq;
      if (!reached(L, p)) return -1;
      double t = L->time[p] + step;
      LRef ref = chunk_ref(c, ph->b_buf, ph->b_per, s->root, j, k), source = L->ref[p];
      int64_t toks[2] = {L->tok[p], -1}, ntok = 1;
      if (p == s->root && c != s->pace && lag > 0 && i >= lag && paced_time[i - lag] <= t)
        toks[ntok++] = paced_tok[i - lag]; /* keep pace with the pace node */
      if (s->down[q]) { /* TreeEmitter._hop: through p's host buffer */
        LRef hop;
        if (stage_up(L, t - 0.5 / (double)m, number, turn, p, c, source, toks[0], &hop,
                     &toks[0]))
          return -1;
        seq = add(L, t, c, key_id(L, K_DOWN_HOST, p, number, turn), L->copy, ref, &hop, 1,
                  toks, ntok);
      } else {
        seq = add(L, t, c, key_id(L, K_DOWN, p, number, turn), L->copy, ref, &source, 1, toks,
                  ntok);
      }
      if (seq < 0) return -1;
      reach(L, c, seq, t, ref);
    }
    if (lag) {
      if (!reached(L, s->pace)) return -1;
      paced_tok[i] = L->tok[s->pace], paced_time[i] = L->time[s->pace];
    }
  }
  return 0;
}

/* A tree's reduction order (_ReduceShape.of): nodes children first, each node's children in
 * edge order (kid_of[first[u] .. first[u + 1])), and each node's height above the deepest
 * leaf. Arrays of nranks (+ 1) entries; 0, -1 on a malformed tree. */
typedef struct {
  int64_t *order, *first, *kids, *height, *up, norder, top;
} Shape;

static int shape_of(Low* L, const LShare* s, Shape* h) {
  int64_t n = L->nranks, *level = h->height;
  for (int64_t v = 0; v < n; ++v) level[v] = -1, h->first[v] = 0;
  level[s->root] = 0;
  h->top = 0;
  for (int64_t q = 0; q < s->nedges; ++q) {
    int64_t p = s->edges[2 * q], c = s->edges[2 * q + 1];
    if (level[p] < 0 || level[c] >= 0) {
      L->bad = "tree edges must run top-down from the root and reach each node once";
      return -1;
    }
    level[c] = level[p] + 1;
    h->top = level[c] > h->top ? level[c] : h->top;
    h->first[p + 1] += 1;
  }
  for (int64_t v = 0; v < n; ++v) h->first[v + 1] += h->first[v];
  int64_t* fill = h->order; /* borrowed as a cursor per node until the order is written */
  for (int64_t v = 0; v < n; ++v) fill[v] = h->first[v];
  for (int64_t q = 0; q < s->nedges; ++q) {
    int64_t at = fill[s->edges[2 * q]]++;
    h->kids[at] = s->edges[2 * q + 1];
    h->up[at] = s->up[q];
  }
  h->norder = s->nedges + 1; /* reversed([root] + children in edge order) */
  for (int64_t q = 0; q < s->nedges; ++q) h->order[s->nedges - 1 - q] = s->edges[2 * q + 1];
  h->order[s->nedges] = s->root;
  for (int64_t q = 0; q < h->norder; ++q) h->height[h->order[q]] = h->top - level[h->order[q]];
  return 0;
}

/* TreeEmitter._through_host: ``ref`` of ``c`` staged into a fresh scratch chunk of ``u``. */
static int through_host(Low* L, double t, int64_t m, int64_t number, int64_t turn, int64_t c,
                        int64_t u, LRef* ref, int64_t* token) {
  LRef hop, mine;
  int64_t up;
  if (stage_up(L, t - 0.6 / (double)m, number, turn, c, u, *ref, *token, &hop, &up) ||
      fresh(L, 0, u, *ref, &mine))
    return -1;
  *token = add(L, t - 0.3 / (double)m, u, key_id(L, K_HOST_DOWN, c, number, turn), L->copy,
               mine, &hop, 1, &up, 1);
  *ref = mine;
  return *token < 0 ? -1 : 0;
}

/* The reduction at ``u`` for piece i (j, k): its own chunk and its children's partials. */
static int reduce_node(Low* L, const Phase* ph, const LShare* s, const Shape* h, int64_t number,
                       int64_t u, int64_t i, int64_t j, int64_t k, LRef* srcs, int64_t* toks) {
  int64_t m = s->npieces, turn = i % L->turns, nk = h->first[u + 1] - h->first[u], staged = 0;
  LRef own = chunk_ref(u, ph->a_buf, ph->a_per, s->root, j, k), dst;
  if (u != s->root ? fresh(L, 0, u, own, &dst) : 0) return -1;
  if (u == s->root) dst = chunk_ref(u, ph->b_buf, ph->b_per, s->root, j, k);
  double t = ((double)i + 0.5 + (double)h->height[u]) / (double)m;
  srcs[0] = own;
  for (int64_t q = 0; q < nk; ++q) {
    int64_t c = h->kids[h->first[u] + q];
    if (!reached(L, c)) return -1;
    srcs[1 + q] = L->ref[c], toks[q] = L->tok[c];
    staged |= h->up[h->first[u] + q];
    if (h->up[h->first[u] + q] && through_host(L, t, m, number, turn, c, u, &srcs[1 + q],
                                              &toks[q]))
      return -1;
  }
  int64_t seq = add(L, t, u, key_id(L, staged ? K_UP_HOST : K_UP, u, number, turn), L->reduce,
                    dst, srcs, 1 + nk, toks, nk);
  if (seq < 0) return -1;
  reach(L, u, seq, t, dst);
  return 0;
}

/* TreeEmitter._reduce_share for share ``number`` of phase ``ph``; records done[root, j]. */
static int reduce_share(Low* L, const Phase* ph, int64_t number, const LShare* s, Shape* h,
                        LRef* srcs, int64_t* toks) {
  if (shape_of(L, s, h)) return -1;
  int64_t m = s->npieces;
  for (int64_t i = 0; i < m; ++i) {
    int64_t j = s->pieces[2 * i], k = s->pieces[2 * i + 1];
    L->now++;
    for (int64_t q = 0; q < h->norder; ++q) { /* leaves: their own chunk, no producer */
      int64_t v = h->order[q];
      if (h->first[v + 1] == h->first[v])
        reach(L, v, -1, 0.0, chunk_ref(v, ph->a_buf, ph->a_per, s->root, j, k));
    }
    for (int64_t q = 0; q < h->norder; ++q) {
      int64_t u = h->order[q];
      if (h->first[u + 1] > h->first[u] &&
          reduce_node(L, ph, s, h, number, u, i, j, k, srcs, toks))
        return -1;
    }
    int64_t at[6] = {s->root, j, 0, 0, 0, 0};
    Entry* e = map_at(&L->done, at);
    if (e == NULL) return L->nomem = 1, -1;
    if (e->v < 0) {
      e->v = L->done_tok.n;
      if (push(&L->done_tok, 0) || grow((void**)&L->done_time, &L->cap_done_time,
                                        L->done_tok.n, sizeof(double)))
        return L->nomem = 1, -1;
    }
    if (!reached(L, s->root)) return -1;
    L->done_tok.data[e->v] = L->tok[s->root];
    L->done_time[e->v] = ((double)i + 0.5 + (double)h->top) / (double)m;
  }
  return 0;
}

static int run_phases(Low* L, const Phase* phases, int64_t nphases) {
  int64_t n = L->nranks;
  Shape h = {malloc((size_t)(n + 1) * sizeof(int64_t)), calloc((size_t)n + 2, sizeof(int64_t)),
             malloc((size_t)(n + 1) * sizeof(int64_t)), malloc((size_t)(n + 1) * sizeof(int64_t)),
             malloc((size_t)(n + 1) * sizeof(int64_t)), 0, 0};
  LRef* srcs = malloc((size_t)(n + 1) * sizeof(LRef));
  int64_t* toks = malloc((size_t)(n + 1) * sizeof(int64_t));
  int rc = h.order && h.first && h.kids && h.height && h.up && srcs && toks ? 0 : -1;
  if (rc) L->nomem = 1;
  for (int64_t f = 0; rc == 0 && f < nphases; ++f) {
    const Phase* ph = &phases[f];
    if (ph->kind == 0) {
      int64_t none = -1;
      rc = add(L, -1.0, ph->rank, key_id(L, K_SELF, 0, 0, 0), L->copy, ph->dst, &ph->src, 1,
               &none, 0) < 0 ? -1 : 0;
      continue;
    }
    for (int64_t q = 0; rc == 0 && q < ph->nshares; ++q) {
      if (ph->shares[q].npieces == 0) continue;
      memset(h.first, 0, (size_t)(n + 2) * sizeof(int64_t));
      rc = ph->kind == 1 ? reduce_share(L, ph, q, &ph->shares[q], &h, srcs, toks)
                         : broadcast_share(L, ph, q, &ph->shares[q]);
    }
  }
  free(h.order), free(h.first), free(h.kids), free(h.height), free(h.up), free(srcs), free(toks);
  return rc;
}

/* ---- dealing onto lanes, as words --------------------------------------------------------- */

typedef struct Lane {
  Vec w;
  int64_t count;
} Lane;

static int64_t* put_ref(int64_t* at, LRef r) {
  at[0] = r.rank, at[1] = r.buf, at[2] = r.chunk, at[3] = r.count;
  return at + 4;
}

/* Item ``it`` as words on lane ``w``: op, dst, sources, its producers' (rank, lane, index) in
 * token order without repeats, no engine (as cx_unpack.c's pack_words writes them). */
static int put_item(Low* L, const Item* it, Vec* w, const int64_t* placed) {
  if (grow((void**)&w->data, &w->cap, w->n + 8 + 4 * it->nsrc + 3 * it->ntok,
           sizeof(int64_t)))
    return L->nomem = 1, -1;
  int64_t* at = &w->data[w->n];
  *at++ = it->op;
  at = put_ref(at, it->dst);
  *at++ = it->nsrc;
  for (int64_t q = 0; q < it->nsrc; ++q) at = put_ref(at, L->srcs[it->src + q]);
  const int64_t* toks = &L->toks.data[it->tok];
  int64_t* m = at++;
  *m = 0;
  for (int64_t q = 0; q < it->ntok; ++q) {
    int seen = toks[q] < 0;
    for (int64_t r = 0; r < q && !seen; ++r) seen = toks[r] == toks[q];
    if (seen) continue;
    const int64_t* d = &placed[3 * toks[q]];
    if (d[0] < 0) {
      L->bad = "an item waits for one that is not earlier in time";
      return -1;
    }
    at[0] = d[0], at[1] = d[1], at[2] = d[2], at += 3, *m += 1;
  }
  *at++ = -1;
  w->n = at - w->data;
  return 0;
}

/* The words' length: every rank's lanes in order, as Schedule.to_packed lays them out (a
 * rank without instructions gets one empty lane). */
static Py_ssize_t joined_length(const Low* L) {
  Py_ssize_t total = 1;
  for (int64_t r = 0; r < L->nranks; ++r) {
    total += 1 + (L->nlanes[r] ? 0 : 1);
    for (int64_t l = 0; l < L->nlanes[r]; ++l) total += 1 + L->lane[r * L->lanes + l].w.n;
  }
  return total;
}

/* Those words into ``at``, little-endian. */
static void join(const Low* L, int64_t* at) {
  int64_t* start = at;
  *at++ = L->nranks;
  for (int64_t r = 0; r < L->nranks; ++r) {
    *at++ = L->nlanes[r] ? L->nlanes[r] : 1;
    if (!L->nlanes[r]) *at++ = 0;
    for (int64_t l = 0; l < L->nlanes[r]; ++l) {
      const Lane* lane = &L->lane[r * L->lanes + l];
      *at++ = lane->count;
      if (lane->w.n) memcpy(at, lane->w.data, (size_t)lane->w.n * sizeof(int64_t));
      at += lane->w.n;
    }
  }
  for (int64_t* w = start; w < at; ++w) *w = cx_le64(*w);
}

/* ``t`` as a key whose unsigned order is the order of the doubles (-0.0 taken as 0.0). */
static uint64_t time_key(double t) {
  uint64_t bits;
  t += 0.0;
  memcpy(&bits, &t, sizeof bits);
  return bits >> 63 ? ~bits : bits | (1ull << 63);
}

/* Item indices in order of time, ties in order of seq (Python's stable sort by time): a
 * least-significant-digit radix sort, 8 bits a pass, passes where all keys agree skipped. */
static int64_t* by_time(Low* L) {
  int64_t n = L->nitems;
  uint64_t* key = malloc((size_t)(n ? n : 1) * sizeof(uint64_t));
  int64_t *order = malloc((size_t)(n ? n : 1) * sizeof(int64_t)),
          *spare = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
  if (key == NULL || order == NULL || spare == NULL) {
    free(key), free(order), free(spare);
    return L->nomem = 1, NULL;
  }
  for (int64_t q = 0; q < n; ++q) key[q] = time_key(L->items[q].t), order[q] = q;
  for (int shift = 0; shift < 64; shift += 8) {
    int64_t count[257] = {0};
    for (int64_t q = 0; q < n; ++q) count[((key[q] >> shift) & 255) + 1]++;
    if (n == 0 || count[((key[0] >> shift) & 255) + 1] == n) continue;
    for (int d = 0; d < 256; ++d) count[d + 1] += count[d];
    for (int64_t q = 0; q < n; ++q) spare[count[(key[order[q]] >> shift) & 255]++] = order[q];
    int64_t* swap = order;
    order = spare, spare = swap;
  }
  free(key), free(spare);
  return order;
}

/* TreeEmitter.flush(packed=True): the items in time order, each on its key's lane, as words
 * per lane (L->lane, L->nlanes). */
static int deal(Low* L) {
  int64_t n = L->nitems, nkeys = L->keys.n, nlw = L->nranks * L->lanes;
  int64_t* order = by_time(L);
  int64_t* lane_of = malloc((size_t)(L->nranks * nkeys + 1) * sizeof(int64_t));
  int64_t* used = calloc((size_t)L->nranks, sizeof(int64_t));
  int64_t* placed = malloc((size_t)(3 * n + 1) * sizeof(int64_t));
  L->nlanes = calloc((size_t)L->nranks, sizeof(int64_t));
  L->lane = calloc((size_t)nlw, sizeof(Lane));
  int rc = order && lane_of && used && L->nlanes && placed && L->lane ? 0 : (L->nomem = 1, -1);
  for (int64_t q = 0; rc == 0 && q < L->nranks * nkeys; ++q) lane_of[q] = -1;
  for (int64_t q = 0; rc == 0 && q < n; ++q) placed[3 * q] = -1;
  for (int64_t q = 0; rc == 0 && q < n; ++q) {
    const Item* it = &L->items[order[q]];
    int64_t* lane = &lane_of[it->rank * nkeys + it->key];
    if (*lane < 0) *lane = used[it->rank]++ % L->lanes;
    Lane* w = &L->lane[it->rank * L->lanes + *lane];
    rc = put_item(L, it, &w->w, placed);
    int64_t* d = &placed[3 * order[q]];
    d[0] = it->rank, d[1] = *lane, d[2] = w->count++;
    if (L->nlanes[it->rank] <= *lane) L->nlanes[it->rank] = *lane + 1;
  }
  free(order), free(lane_of), free(used), free(placed);
  return rc;
}

/* ---- Python ------------------------------------------------------------------------------- */

static int64_t as_int(PyObject* o, int64_t lo, int64_t hi, const char* what) {
  long long v = PyLong_Check(o) ? PyLong_AsLongLong(o) : (PyErr_Clear(), lo - 1);
  if (v == -1 && PyErr_Occurred()) PyErr_Clear(), v = lo - 1;
  if (v >= lo && v <= hi) return v;
  PyErr_Format(PyExc_ValueError, "lower_words: %s %R is not an int in [%lld, %lld]", what, o,
               (long long)lo, (long long)hi);
  return lo - 1;
}

/* ``o`` as a tuple of exactly ``n`` items (n < 0: any), or TypeError naming ``what``. */
static PyObject* tuple_of(PyObject* o, Py_ssize_t n, const char* what) {
  if (PyTuple_Check(o) && (n < 0 || PyTuple_GET_SIZE(o) == n)) return o;
  PyErr_Format(PyExc_TypeError, "lower_words: %s must be a tuple%s, got %R", what,
               n < 0 ? "" : " of the documented length", o);
  return NULL;
}

/* Reads ``n`` ints of ``o`` (a tuple) within [lo, hi] into ``out``; -1 on error. */
static int read_ints(PyObject* o, int64_t* out, Py_ssize_t n, int64_t lo, int64_t hi,
                     const char* what) {
  if (tuple_of(o, n, what) == NULL) return -1;
  for (Py_ssize_t q = 0; q < n; ++q)
    if ((out[q] = as_int(PyTuple_GET_ITEM(o, q), lo, hi, what)) < lo) return -1;
  return 0;
}

static int read_ref(Low* L, PyObject* o, LRef* r) {
  int64_t v[4];
  if (read_ints(o, v, 4, -CX_LOWER_MAX, CX_LOWER_MAX, "a Ref (rank, buffer, chunk, count)"))
    return -1;
  if (v[0] < 0 || v[0] >= L->nranks) {
    PyErr_Format(PyExc_ValueError, "lower_words: Ref rank %lld is not in [0, %lld)",
                 (long long)v[0], (long long)L->nranks);
    return -1;
  }
  *r = (LRef){v[0], v[1], v[2], v[3]};
  return 0;
}

/* A (parent, child) per edge and a flag per edge, pairs of pieces. */
static int read_pairs(PyObject* o, int64_t* out, int64_t lo, int64_t hi, const char* what) {
  for (Py_ssize_t q = 0; q < PyTuple_GET_SIZE(o); ++q)
    if (read_ints(PyTuple_GET_ITEM(o, q), &out[2 * q], 2, lo, hi, what)) return -1;
  return 0;
}

static int read_flags(PyObject* o, char* out, Py_ssize_t n, const char* what) {
  if (tuple_of(o, n, what) == NULL) return -1;
  for (Py_ssize_t q = 0; q < n; ++q) {
    int b = PyObject_IsTrue(PyTuple_GET_ITEM(o, q));
    if (b < 0) return -1;
    out[q] = (char)b;
  }
  return 0;
}

static int read_share(Low* L, PyObject* o, LShare* s) {
  Py_ssize_t n = PyTuple_Check(o) ? PyTuple_GET_SIZE(o) : 0;
  if (tuple_of(o, n == 6 ? 6 : 5, "a share (root, edges, pieces, staged down, staged up[, pace])")
      == NULL)
    return -1;
  s->pace = n == 6 ? as_int(PyTuple_GET_ITEM(o, 5), -1, L->nranks - 1, "a share's pace") : -1;
  if (n == 6 && s->pace < -1) return -1;
  PyObject *edges = PyTuple_GET_ITEM(o, 1), *pieces = PyTuple_GET_ITEM(o, 2);
  if ((s->root = as_int(PyTuple_GET_ITEM(o, 0), 0, L->nranks - 1, "a share's root")) < 0 ||
      tuple_of(edges, -1, "a share's edges") == NULL ||
      tuple_of(pieces, -1, "a share's pieces") == NULL)
    return -1;
  s->nedges = PyTuple_GET_SIZE(edges), s->npieces = PyTuple_GET_SIZE(pieces);
  s->edges = malloc((size_t)(2 * s->nedges + 1) * sizeof(int64_t));
  s->pieces = malloc((size_t)(2 * s->npieces + 1) * sizeof(int64_t));
  s->down = malloc((size_t)s->nedges + 1), s->up = malloc((size_t)s->nedges + 1);
  if (!s->edges || !s->pieces || !s->down || !s->up) return PyErr_NoMemory(), -1;
  return read_pairs(edges, s->edges, 0, L->nranks - 1, "a tree edge (parent, child)") ||
                 read_pairs(pieces, s->pieces, -CX_LOWER_MAX, CX_LOWER_MAX,
                            "a piece (first chunk, chunks)") ||
                 read_flags(PyTuple_GET_ITEM(o, 3), s->down, s->nedges, "staged down flags") ||
                 read_flags(PyTuple_GET_ITEM(o, 4), s->up, s->nedges, "staged up flags")
             ? -1
             : 0;
}

/* A ChunkRefs as (buffer index, per_root). */
static int read_chunks(PyObject* o, int64_t* buf, int64_t* per) {
  int64_t v[2];
  if (read_ints(o, v, 2, -CX_LOWER_MAX, CX_LOWER_MAX, "a ChunkRefs (buffer, per_root)"))
    return -1;
  *buf = v[0], *per = v[1];
  return 0;
}

static int read_phase(Low* L, PyObject* o, Phase* ph) {
  if (tuple_of(o, -1, "a phase") == NULL) return -1;
  if (PyTuple_GET_SIZE(o) < 4) {
    PyErr_Format(PyExc_TypeError, "lower_words: a phase has 4 or 5 fields, got %R", o);
    return -1;
  }
  if ((ph->kind = as_int(PyTuple_GET_ITEM(o, 0), 0, 2, "a phase kind")) < 0) return -1;
  if (ph->kind == 0)
    return tuple_of(o, 4, "a copy phase") == NULL ||
                   (ph->rank = as_int(PyTuple_GET_ITEM(o, 1), 0, L->nranks - 1, "rank")) < 0 ||
                   read_ref(L, PyTuple_GET_ITEM(o, 2), &ph->dst) ||
                   read_ref(L, PyTuple_GET_ITEM(o, 3), &ph->src)
               ? -1
               : 0;
  PyObject* shares = PyTuple_GET_ITEM(o, 1);
  if (tuple_of(o, ph->kind == 1 ? 4 : 5, "a tree phase") == NULL ||
      tuple_of(shares, -1, "shares") == NULL ||
      read_chunks(PyTuple_GET_ITEM(o, 2), &ph->a_buf, &ph->a_per) ||
      read_chunks(PyTuple_GET_ITEM(o, 3), &ph->b_buf, &ph->b_per))
    return -1;
  ph->after = ph->kind == 2 ? PyObject_IsTrue(PyTuple_GET_ITEM(o, 4)) : 0;
  ph->nshares = PyTuple_GET_SIZE(shares);
  ph->shares = calloc((size_t)ph->nshares + 1, sizeof(LShare));
  if (ph->after < 0 || ph->shares == NULL) return ph->after < 0 ? -1 : (PyErr_NoMemory(), -1);
  for (int64_t q = 0; q < ph->nshares; ++q)
    if (read_share(L, PyTuple_GET_ITEM(shares, q), &ph->shares[q])) return -1;
  return 0;
}

static void low_free(Low* L, Phase* phases, int64_t nphases) {
  for (int64_t f = 0; phases != NULL && f < nphases; ++f) {
    for (int64_t q = 0; phases[f].shares != NULL && q < phases[f].nshares; ++q) {
      LShare* s = &phases[f].shares[q];
      free(s->edges), free(s->pieces), free(s->down), free(s->up);
    }
    free(phases[f].shares);
  }
  free(phases);
  for (int kind = 0; kind < 2; ++kind) {
    for (int64_t r = 0; r < L->nranks; ++r) {
      if (L->nexts[kind] != NULL) free(L->nexts[kind][r]);
      if (L->units[kind] != NULL) free(L->units[kind][r].data);
    }
    free(L->nexts[kind]), free(L->units[kind]), free(L->reserved[kind]);
  }
  free(L->items), free(L->srcs), free(L->toks.data), free(L->staged_val.data);
  free(L->done_tok.data), free(L->done_time);
  map_free(&L->keys), map_free(&L->staged), map_free(&L->done);
  free(L->tok), free(L->stamp), free(L->time), free(L->ref);
  for (int64_t q = 0; L->lane != NULL && q < L->nranks * L->lanes; ++q) free(L->lane[q].w.data);
  free(L->lane), free(L->nlanes);
}

/* The builder's units per rank (a list of nranks ints >= 0) into ``out``; -1 on error. */
static int read_units(PyObject* list, int64_t n, int64_t** out, const char* what) {
  if (!PyList_Check(list) || PyList_GET_SIZE(list) != n) {
    PyErr_Format(PyExc_TypeError, "lower_words: %s must be a list of an int per rank", what);
    return -1;
  }
  if ((*out = calloc((size_t)n, sizeof(int64_t))) == NULL) return PyErr_NoMemory(), -1;
  for (int64_t r = 0; r < n; ++r)
    if (((*out)[r] = as_int(PyList_GET_ITEM(list, r), 0, CX_LOWER_UNITS, what)) < 0) return -1;
  return 0;
}

static int write_units(PyObject* list, const int64_t* units, int64_t n) {
  for (int64_t r = 0; r < n; ++r) {
    PyObject* v = PyLong_FromLongLong(units[r]);
    if (v == NULL || PyList_SetItem(list, r, v) < 0) return -1; /* SetItem steals v */
  }
  return 0;
}

static int low_init(Low* L, PyObject* const* args) {
  int64_t codes[4];
  if ((L->nranks = as_int(args[0], 1, 1 << 20, "nranks")) < 1 ||
      (L->nchunks = as_int(args[1], 1, CX_LOWER_UNITS, "nchunks")) < 1 ||
      (L->lanes = as_int(args[2], 1, 1 << 16, "lanes")) < 1 ||
      (L->turns = as_int(args[3], 1, 1 << 16, "turns")) < 1 ||
      read_ints(args[4], codes, 4, 0, 1 << 16, "codes (copy, reduce, scratch, host)"))
    return -1;
  L->copy = codes[0], L->reduce = codes[1], L->bufs[0] = codes[2], L->bufs[1] = codes[3];
  int64_t n = L->nranks;
  for (int kind = 0; kind < 2; ++kind) {
    L->nexts[kind] = calloc((size_t)n, sizeof(int64_t*));
    L->units[kind] = calloc((size_t)n, sizeof(Vec));
    if (L->nexts[kind] == NULL || L->units[kind] == NULL) return PyErr_NoMemory(), -1;
  }
  L->tok = malloc((size_t)n * sizeof(int64_t)), L->time = malloc((size_t)n * sizeof(double));
  L->stamp = malloc((size_t)n * sizeof(int64_t)), L->ref = malloc((size_t)n * sizeof(LRef));
  if (!L->tok || !L->time || !L->stamp || !L->ref) return PyErr_NoMemory(), -1;
  for (int64_t v = 0; v < n; ++v) L->stamp[v] = -1;
  return read_units(args[5], n, &L->reserved[0], "scratch") ||
                 read_units(args[6], n, &L->reserved[1], "host")
             ? -1
             : 0;
}

PyObject* cx_lower_words(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 8) {
    PyErr_SetString(PyExc_TypeError, "lower_words(nranks, nchunks, lanes, turns, codes, "
                    "scratch, host, phases)");
    return NULL;
  }
  Low L = {0};
  Phase* phases = NULL;
  int64_t nphases = 0;
  int rc = low_init(&L, args);
  if (rc == 0 && !PyList_Check(args[7])) {
    PyErr_SetString(PyExc_TypeError, "lower_words: phases must be a list");
    rc = -1;
  }
  if (rc == 0) {
    nphases = PyList_GET_SIZE(args[7]);
    phases = calloc((size_t)nphases + 1, sizeof(Phase));
    rc = phases == NULL ? (PyErr_NoMemory(), -1) : 0;
  }
  for (int64_t f = 0; rc == 0 && f < nphases; ++f)
    rc = read_phase(&L, PyList_GET_ITEM(args[7], f), &phases[f]);
  if (rc == 0) {
    Py_BEGIN_ALLOW_THREADS   /* from here on, plain C: candidates lower two at once */
    rc = run_phases(&L, phases, nphases);
    if (rc == 0) rc = deal(&L);
    Py_END_ALLOW_THREADS
    if (rc && L.bad != NULL)
      PyErr_Format(PyExc_ValueError, "lower_words: %s", L.bad);
    else if (rc)
      PyErr_NoMemory();
  }
  PyObject* words = NULL;
  if (rc == 0 && write_units(args[5], L.reserved[0], L.nranks) == 0 &&
      write_units(args[6], L.reserved[1], L.nranks) == 0)
    words = PyBytes_FromStringAndSize(NULL, joined_length(&L) * (Py_ssize_t)sizeof(int64_t));
  if (words != NULL) join(&L, (int64_t*)PyBytes_AS_STRING(words));
  low_free(&L, phases, nphases);
  return words;
}
