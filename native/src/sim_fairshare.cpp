// Flow simulator event loop: max-min fair link sharing over a task graph.
//
// How it works: this is collectx/schedule/_fairshare.py (FlowLoop, progressive_fill) plus the
// task bookkeeping of collectx/schedule/simulate.py, operation for operation, so the two give
// the same numbers. A task (one instruction, or one engine call) starts when any of its member
// nodes has no unfinished predecessor; it queues its flows (parts) after their route latency
// and finishes with its last flow, which may start successor tasks. Flows of one route class
// always share one rate, so each active class keeps a *served* counter (bytes every one of its
// flows has moved) and a min-heap of the counter values at which its flows end: an event costs
// O(active classes). Planning simulates thousands of events per schedule; in Python that was
// most of the planning time.
//
// Rates: a class whose resources no other class of the graph crosses (an NVLink route, say) is
// always alone, so its flows share its bottleneck: its rate is updated on the spot whenever its
// flow count changes. The other classes are rated together by progressive filling, and only
// after an event that changed one of them (activated, left, or its count moved), since their
// rates depend on nothing else. On tree plans most events touch alone classes only. Which
// active classes cross each resource, their flows per resource and how many of a class's
// resources it shares are kept up to date as classes come and go (most events only move a
// count), so a filling starts from them instead of rebuilding them: on switched machines with
// host staging nearly every event refills a few hundred classes.
//
// The floating-point operations and their order per quantity match the Python code (the
// filling is order-independent: every per-resource and per-class quantity is updated on its
// own), and ties between equal times break by flow id as Python's heapq on (time, flow) does.

#include <algorithm>
#include <functional>
#include <limits>
#include <queue>
#include <utility>
#include <vector>

#include "collectx.h"

namespace {

constexpr double kEps = 1e-12;  // _fairshare._EPS
constexpr double kNever = 1e300;    // give_up_us of a run that is never given up
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr long kGiveUpEvery = 64;   // events between give-up checks (each O(resources))

using Entry = std::pair<double, int>;  // (time or served bytes, flow id)
using MinHeap = std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>>;

struct ClassState {
  bool active = false;
  int count = 0;         // active flows of the class
  double served = 0.0;   // bytes each of its flows has moved since the class became active
  MinHeap ends;          // (served at end, flow)
  double next_end = 0.0;    // ends.top().first, kept beside the heap: read every event
  double next_slack = 0.0;  // the end test's tolerance for that flow
};

class Sim {
 public:
  explicit Sim(const cx_sim_graph* g)
      : g_(g), cls_(g->nclasses), users_(g->nres, 0), left_(g->nres, 0.0),
        crossing_(g->nres), flows_left_(g->ntasks, 0), started_(g->ntasks, 0),
        waiting_(g->npreds, g->npreds + g->nnodes), rate_(g->nclasses, 0.0),
        rated_(g->nclasses, 0), alone_(g->nclasses, 0), bottleneck_(g->nclasses, 0.0),
        total_(g->nres, 0), busy_at_(g->nres, -1), shared_at_(g->nclasses, -1),
        crowded_(g->nclasses, 0) {
    find_alone_classes();
    floor_.resize(g->nres);
    for (int r = 0; r < g->nres; ++r) floor_[r] = kEps * g->capacity[r];
  }

  int run(double* time_us, int* start_order, int* nstarted, double give_up_us,
          const volatile int* stop, int* given_up, double* finish_us) {
    *given_up = 0;
    order_out_ = start_order;
    finish_out_ = finish_us;
    if (give_up_us < kNever) count_link_bytes();
    for (int v = 0; v < g_->nnodes; ++v)
      if (waiting_[v] == 0) start(g_->node_task[v]);
    for (long events = 1; !pending_.empty() || !active_.empty(); ++events) {
      if (events % kGiveUpEvery == 0) {
        bool unwanted = stop && *stop;  // another thread no longer wants the result
        if (unwanted || (give_up_us < kNever && sure_later(give_up_us))) {
          *time_us = unwanted ? now_ : least_end_;
          *nstarted = nstarted_;
          *given_up = unwanted ? 2 : 1;
          return CX_OK;
        }
      }
      start_due();
      if (active_.empty()) {
        if (!pending_.empty()) now_ = pending_.top().first;
        continue;
      }
      if (shared_dirty_) fill();
      double step = kInf;  // active_ is not empty: some class ends sooner
      for (int c : active_) {
        const ClassState& s = cls_[c];
        double t = (s.next_end - s.served) / rate_[c];
        step = t < step ? t : step;  // no branch on the quotient: the divisions overlap
      }
      if (!pending_.empty()) step = std::min(step, pending_.top().first - now_);
      advance(std::max(step, 0.0));
    }
    *time_us = now_;
    *nstarted = nstarted_;
    return CX_OK;
  }

 private:
  void start(int t) {
    if (started_[t]) return;
    started_[t] = 1;
    order_out_[nstarted_++] = t;
    int lo = g_->part_off[t], hi = g_->part_off[t + 1];
    flows_left_[t] = hi - lo;
    for (int p = lo; p < hi; ++p) {
      int f = static_cast<int>(size_.size());
      size_.push_back(g_->part_bytes[p]);
      fcls_.push_back(g_->part_class[p]);
      ftask_.push_back(t);
      pending_.push({now_ + g_->part_latency[p], f});
    }
    if (hi == lo) finish(t);
  }

  void finish(int t) {
    if (finish_out_) finish_out_[t] = now_;
    for (int m = g_->member_off[t]; m < g_->member_off[t + 1]; ++m) {
      int v = g_->members[m];
      for (int k = g_->succ_off[v]; k < g_->succ_off[v + 1]; ++k) {
        int w = g_->succs[k];
        if (--waiting_[w] == 0) start(g_->node_task[w]);
      }
    }
  }

  // The heap's least end moved (a flow joined, or the least left).
  void top_changed(ClassState& s) {
    s.next_end = s.ends.top().first;
    s.next_slack = 1e-9 * std::max(size_[s.ends.top().second], 1.0);
  }

  void on_done(int f) {
    int t = ftask_[f];
    if (--flows_left_[t] == 0) finish(t);
  }

  // fill, advance and start_due stay out of run()'s loop: inlined there, the loop's hot values
  // no longer fit in registers, and large plans simulated about a sixth slower.
  [[gnu::noinline]] void start_due() {
    // Zero-byte flows finish as soon as their latency has passed; finishing may queue more.
    while (!pending_.empty() && pending_.top().first <= now_ * (1 + kEps) + kEps) {
      int f = pending_.top().second;
      pending_.pop();
      if (size_[f] <= 0.0) {
        on_done(f);
        continue;
      }
      int c = fcls_[f];
      ClassState& s = cls_[c];
      if (!s.active) {
        s.active = true;
        s.served = 0.0;
        s.count = 0;
        active_.push_back(c);
        if (!alone_[c]) join(c);
      }
      s.ends.push({s.served + size_[f], f});
      top_changed(s);
      if (!unmoved_.empty())
        for (const int* r = route_begin(c); r != route_end(c); ++r) unmoved_[*r] -= size_[f];
      count_changed(c, s.count + 1);
    }
  }

  [[gnu::noinline]] void advance(double step) {
    now_ += step;
    done_.clear();
    for (size_t i = 0; i < active_.size();) {
      int c = active_[i];
      ClassState& s = cls_[c];
      double served = s.served + rate_[c] * step;
      s.served = served;
      if (s.next_end - served <= s.next_slack) {
        do {
          done_.push_back(s.ends.top().second);
          s.ends.pop();
        } while (!s.ends.empty() &&
                 s.ends.top().first - served <= 1e-9 * std::max(size_[s.ends.top().second], 1.0));
        if (!s.ends.empty()) top_changed(s);
      }
      if (s.ends.empty()) {  // the class leaves the active set, keeping the others' order
        s.active = false;
        if (!alone_[c]) {
          move_users(c, -s.count);
          leave(c);
          shared_dirty_ = true;
        }
        s.count = 0;
        active_.erase(active_.begin() + static_cast<long>(i));
      } else {
        int count = static_cast<int>(s.ends.size());
        if (count != s.count) count_changed(c, count);
        ++i;
      }
    }
    for (int f : done_) on_done(f);  // may queue flows; never re-enters advance
  }

  // Bytes every resource carries in the whole run (once per time a route lists it), before
  // any flow starts: what is left of them once flows start bounds the run from below.
  void count_link_bytes() {
    unmoved_.assign(g_->nres, 0.0);
    for (int p = 0; p < g_->part_off[g_->ntasks]; ++p)
      for (const int* r = route_begin(g_->part_class[p]); r != route_end(g_->part_class[p]); ++r)
        unmoved_[*r] += g_->part_bytes[p];
  }

  // Whether the run must end after give_up_us: no resource carries more than its capacity, so
  // one whose flows not yet moving hold b bytes is busy for b / capacity more at least (a
  // margin of 1e-6 over the filling's and the end test's tolerances of 1e-9).
  bool sure_later(double give_up_us) {
    least_end_ = now_;
    for (int r = 0; r < g_->nres; ++r)
      if (g_->capacity[r] > 0.0)
        least_end_ = std::max(least_end_, now_ + unmoved_[r] / g_->capacity[r]);
    return least_end_ > give_up_us * (1 + 1e-6);
  }

  // Classes used by some flow whose resources no other such class crosses, and their
  // bottleneck capacities.
  void find_alone_classes() {
    std::vector<char> used(g_->nclasses, 0);
    for (int p = 0; p < g_->part_off[g_->ntasks]; ++p) used[g_->part_class[p]] = 1;
    std::vector<int> crossers(g_->nres, 0);
    for (int c = 0; c < g_->nclasses; ++c)
      if (used[c])
        for (const int* r = route_begin(c); r != route_end(c); ++r) ++crossers[*r];
    for (int c = 0; c < g_->nclasses; ++c) {
      bool alone = used[c];
      double cap = g_->capacity[*route_begin(c)];
      for (const int* r = route_begin(c); r != route_end(c); ++r) {
        alone = alone && crossers[*r] == 1;
        cap = std::min(cap, g_->capacity[*r]);
      }
      alone_[c] = alone;
      bottleneck_[c] = cap;
    }
  }

  // Class c's flow count moves to `count` (it may have just become active).
  void count_changed(int c, int count) {
    if (alone_[c]) {
      cls_[c].count = count;
      rate_[c] = bottleneck_[c] / count;
      return;
    }
    move_users(c, count - cls_[c].count);
    cls_[c].count = count;
    shared_dirty_ = true;
  }

  void move_users(int c, int delta) {
    for (const int* r = route_begin(c); r != route_end(c); ++r) total_[*r] += delta;
  }

  // A shared class becomes active: it joins the crossing list of each resource on its route
  // (once per time the route lists it, as the Python filling counts it).
  void join(int c) {
    shared_at_[c] = static_cast<int>(shared_.size());
    shared_.push_back(c);
    crowded_[c] = 0;
    for (const int* r = route_begin(c); r != route_end(c); ++r) {
      std::vector<int>& on = crossing_[*r];
      if (on.empty()) {
        busy_at_[*r] = static_cast<int>(busy_.size());
        busy_.push_back(*r);
      } else if (on.size() == 1) {
        ++crowded_[on[0]];  // its only user so far no longer has it alone
      }
      on.push_back(c);
      if (on.size() > 1) ++crowded_[c];
    }
  }

  // A shared class leaves the active set (its users already taken off the totals).
  void leave(int c) {
    for (const int* r = route_begin(c); r != route_end(c); ++r) {
      std::vector<int>& on = crossing_[*r];
      auto it = std::find(on.begin(), on.end(), c);
      *it = on.back();
      on.pop_back();
      if (on.size() == 1) {
        --crowded_[on[0]];
      } else if (on.empty()) {
        int at = busy_at_[*r];
        busy_at_[busy_.back()] = at;
        busy_[at] = busy_.back();
        busy_.pop_back();
        busy_at_[*r] = -1;
      }
    }
    int at = shared_at_[c];
    shared_at_[shared_.back()] = at;
    shared_[at] = shared_.back();
    shared_.pop_back();
    shared_at_[c] = -1;
  }

  const int* route_begin(int c) const { return g_->class_res + g_->class_off[c]; }
  const int* route_end(int c) const { return g_->class_res + g_->class_off[c + 1]; }

  // progressive_fill of _fairshare.py over the active shared classes weighted by their flow
  // counts (the classes that are always alone keep the rates count_changed gave them).
  [[gnu::noinline]] void fill() {
    shared_dirty_ = false;
    // Raw pointers: the stores into users_ could otherwise alias the graph's arrays, and the
    // compiler would reload them after every one.
    int* __restrict users = users_.data();
    double* __restrict left = left_.data();
    double* __restrict rate = rate_.data();
    char* __restrict rated = rated_.data();
    const int* __restrict total = total_.data();
    const int* __restrict coff = g_->class_off;
    const int* __restrict cres = g_->class_res;
    const double* __restrict cap = g_->capacity;
    const double* __restrict floor = floor_.data();
    for (int r : busy_) users[r] = total[r];
    for (int c : shared_) {
      rated[c] = 0;
      if (crowded_[c] > 0) continue;
      // A class alone on every resource it crosses gets its bottleneck's capacity.
      rate[c] = bottleneck_[c] / cls_[c].count;
      rated[c] = 1;
      for (int k = coff[c]; k < coff[c + 1]; ++k) users[cres[k]] = 0;
    }
    live_.clear();
    double inc = kInf;  // the water level's next rise: the least room per user
    for (int r : busy_) {
      if (users[r] > 0) {
        left[r] = cap[r];
        double room = left[r] / users[r];
        inc = room < inc ? room : inc;
        live_.push_back(r);
      }
    }
    double level = 0.0;
    int* live = live_.data();
    size_t nlive = live_.size();
    while (nlive > 0) {
      level += inc;
      full_.clear();
      for (size_t i = 0; i < nlive; ++i) {
        int r = live[i];
        int n = users[r];
        left[r] -= inc * n;
        if (left[r] <= floor[r] + 1e-9 * inc * n) full_.push_back(r);
      }
      for (int r : full_) {
        for (int c : crossing_[r]) {
          if (rated[c]) continue;
          rate[c] = level;
          rated[c] = 1;
          int count = cls_[c].count;
          for (int k = coff[c]; k < coff[c + 1]; ++k) users[cres[k]] -= count;
        }
      }
      // Drop the resources whose users are all rated, finding the next rise on the way (one
      // pass over the live resources where there were two). The least room is kept without
      // a branch on each quotient, so the divisions overlap instead of waiting on each other:
      // a tenth off simulations of switched machines with host staging.
      size_t k = 0;
      inc = kInf;  // stays so only once no resource is live, and the filling ends
      for (size_t i = 0; i < nlive; ++i) {
        int r = live[i];
        if (users[r] <= 0) continue;
        double room = left[r] / users[r];
        inc = room < inc ? room : inc;
        live[k++] = r;
      }
      nlive = k;
    }
  }

  const cx_sim_graph* g_;
  std::vector<ClassState> cls_;
  std::vector<int> active_;  // active classes in activation order
  std::vector<int> users_;
  std::vector<double> left_;
  std::vector<std::vector<int>> crossing_;  // active shared classes per resource
  std::vector<int> busy_, live_, full_, done_;
  std::vector<int> shared_;          // active classes that are not always alone
  std::vector<double> size_;
  std::vector<int> fcls_, ftask_;
  std::vector<int> flows_left_;
  std::vector<char> started_;
  std::vector<int> waiting_;
  std::vector<double> rate_;
  std::vector<char> rated_;
  std::vector<char> alone_;          // class never shares a resource with another class
  std::vector<double> bottleneck_;   // least capacity on the class's route
  std::vector<double> floor_;        // kEps * capacity per resource: a full one's least room
  std::vector<int> total_;           // flows of active shared classes per resource
  std::vector<int> busy_at_;         // index of a resource in busy_, or -1
  std::vector<int> shared_at_;       // index of a class in shared_, or -1
  std::vector<int> crowded_;         // resources of an active shared class others cross too
  std::vector<double> unmoved_;      // bytes per resource of flows not yet moving (give-up runs)
  double least_end_ = 0.0;           // the last sure_later() bound
  bool shared_dirty_ = true;         // a class that shares resources changed since fill()
  MinHeap pending_;
  double now_ = 0.0;
  int* order_out_ = nullptr;
  double* finish_out_ = nullptr;     // when each task finished, where the caller asks
  int nstarted_ = 0;
};

bool valid(const cx_sim_graph* g) {
  if (!g || g->nres < 0 || g->nclasses < 0 || g->ntasks < 0 || g->nnodes < 0) return false;
  if (g->ntasks > 0 && (!g->part_off || !g->member_off)) return false;
  if (g->nnodes > 0 && (!g->node_task || !g->succ_off || !g->npreds)) return false;
  if (g->nclasses > 0 && !g->class_off) return false;
  for (int c = 0; c < g->nclasses; ++c) {
    if (g->class_off[c + 1] <= g->class_off[c]) return false;  // every route crosses something
    for (int k = g->class_off[c]; k < g->class_off[c + 1]; ++k)
      if (g->class_res[k] < 0 || g->class_res[k] >= g->nres) return false;
  }
  for (int t = 0; t < g->ntasks; ++t)
    for (int p = g->part_off[t]; p < g->part_off[t + 1]; ++p)
      if (g->part_class[p] < 0 || g->part_class[p] >= g->nclasses) return false;
  for (int t = 0; t < g->ntasks; ++t)
    for (int m = g->member_off[t]; m < g->member_off[t + 1]; ++m)
      if (g->members[m] < 0 || g->members[m] >= g->nnodes) return false;
  for (int v = 0; v < g->nnodes; ++v) {
    if (g->node_task[v] < 0 || g->node_task[v] >= g->ntasks) return false;
    for (int k = g->succ_off[v]; k < g->succ_off[v + 1]; ++k)
      if (g->succs[k] < 0 || g->succs[k] >= g->nnodes) return false;
  }
  return true;
}

}  // namespace

extern "C" int cx_sim_fairshare(const cx_sim_graph* graph, double* time_us, int* start_order,
                                int* nstarted) {
  int given_up = 0;
  return cx_sim_fairshare_within(graph, kNever, time_us, start_order, nstarted, &given_up);
}

extern "C" int cx_sim_fairshare_within(const cx_sim_graph* graph, double give_up_us,
                                       double* time_us, int* start_order, int* nstarted,
                                       int* given_up) {
  return cx_sim_fairshare_stoppable(graph, give_up_us, nullptr, time_us, start_order, nstarted,
                                    given_up);
}

extern "C" int cx_sim_fairshare_stoppable(const cx_sim_graph* graph, double give_up_us,
                                          const volatile int* stop, double* time_us,
                                          int* start_order, int* nstarted, int* given_up) {
  return cx_sim_fairshare_timed(graph, give_up_us, stop, time_us, start_order, nstarted,
                                given_up, nullptr);
}

extern "C" int cx_sim_fairshare_timed(const cx_sim_graph* graph, double give_up_us,
                                      const volatile int* stop, double* time_us,
                                      int* start_order, int* nstarted, int* given_up,
                                      double* finish_us) {
  if (!valid(graph) || !time_us || !nstarted || !given_up ||
      (graph->ntasks > 0 && !start_order))
    return CX_ERR_ARG;
  try {
    Sim sim(graph);
    return sim.run(time_us, start_order, nstarted, give_up_us, stop, given_up, finish_us);
  } catch (const std::bad_alloc&) {
    return CX_ERR_NOMEM;
  } catch (...) {
    return CX_ERR_INTERNAL;
  }
}
