// Tail balancing of the decode schedule (DecodeScheduleOptions::balance_tail): the algorithm, its
// makespan bound and the workspace-bound proof are in the comment below; decode_scheduler.cpp
// calls it after the greedy and writes the items it returns.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "scheduler/decode_schedule_state.h"

namespace flashkv::scheduler::detail {

// Tail balancing (balance_tail). The greedy hands chunks, longest first, to the least-loaded unit;
// when the chunks are of similar length its last round is partial: 256 x 2048-token request
// chunks on 33 blocks give 25 blocks 8 chunks and 8 blocks 7 (makespan 8 chunks, mean 7.76).
// Cutting every chunk shorter does not help (the rounds stay whole). Instead, water-filling:
//  1. A = W / U, W the total cost of the greedy chunks, U the units. The greedy's assignment of
//     a prefix of the chunks does not depend on the rest, so it is replayed from the plain
//     greedy's: the head is the chunks before the first one that, on the least-loaded unit the
//     greedy gives it, ends above A; they keep their units (the full rounds, whole chunks).
//  2. The tail (that chunk and every later one: the shortest) is poured, in the same order and
//     each chunk in KV order, into the units in order of increasing head load (ties by index),
//     McNaughton's wrap-around rule: a unit takes whole chunks while they fit under a level M;
//     the first that does not is cut, its first piece filling the unit up to M (a piece costs
//     alpha + beta * tokens, so alpha counts for every piece) and the rest going on to the next
//     unit. No cut piece is shorter than min_chunk_tokens (a piece that would be, or leave a
//     rest that would be, is not cut: that unit's gap stays unused). Whatever is left when the
//     units are exhausted goes whole to the least-loaded unit.
//  3. M: the water level M0 of the tail alone (sum over units of max(0, M0 - head load) = tail
//     cost), raised for the pieces' alpha and the gaps left unused. Each unit is left with an
//     unused gap below alpha + beta * (2 min_chunk + 1) (the rest of a chunk of < 2 min_chunk
//     tokens that does not fit, or a gap below one min_chunk piece), and starts with at most one
//     piece cut from a chunk the previous unit began (one extra alpha); so at M0 + S, S =
//     2 alpha + beta * (2 min_chunk + 1), each unit takes >= M0 - its head load of the tail's
//     original cost, and the tail is placed before the units run out: makespan <= M0 + S <=
//     A + S, A the mean load of the plain schedule (M0 = A when, as here, every head load is
//     <= A). Lower levels are tried first (step 3 below).
//  4. The result is kept only if its makespan is below the plain greedy's (so never worse).
// Items: a unit runs its head chunks in greedy order, then its tail pieces by cost descending;
// head chunks cost >= the first tail chunk >= every piece, so each unit's list stays in
// non-increasing cost order.
// Slots and chunk indices: a request's chunks enter the greedy order in KV order (its longer
// chunks come first in KV order and in cost order), so its tail chunks are a KV suffix of its
// tile: head chunks keep their indices, and the pieces of tail chunk j become chunks j + (pieces
// added by the request's earlier tail cuts) onward. Tile chunk counts (the same for every head:
// a greedy chunk is a request chunk in block mode, and with one KV head a tile is a request),
// slot bases and merge items are then recomputed in request order, so the layout of
// decode_plan.cuh "Slots" holds unchanged, with chunks of one tile of different lengths.
// Workspace bounds: a cut makes one more greedy chunk (one stored item; num_kv_heads CTA items in
// block mode) and adds num_kv_heads slots (2 num_kv_heads when it splits a tile that was whole).
// A cut is made only while the schedule's totals stay within min(capacity, bound): stored items
// <= batch + U (= (batch * num_kv_heads + num_ctas) / ctas_per_unit: max_decode_work_items) and
// slots <= 2 * num_ctas (max_split_slots). The plain schedule satisfies both (the proof at the
// top of decode_scheduler.cpp), and each admitted cut keeps them, so they hold for the result.
// (The wrap makes at most one cut per unit it leaves, so at most U cuts: <= num_ctas more CTA
// items; the explicit check is still needed, as the plain schedule may already use most of the
// room.)
// Returns the head length (greedy chunks, in greedy order, kept where the plain greedy put them),
// with sc.head_load / sc.head_count the units' head loads and item counts and sc.best_pieces the
// tail's pieces; or -1 where the plain schedule stays.
int64_t balance_tail(const DecodeScheduleOptions& o, const std::vector<ChunkRun>& runs,
                     const std::vector<uint64_t>& order, const int* unit_of,
                     const std::vector<double>& plain_loads, int units, int batch,
                     int64_t num_items, int64_t num_slots, PlanScratch& sc) {
  const double alpha = o.cost.alpha, beta = o.cost.beta, inv_beta = 1 / beta;
  const int heads = o.num_kv_heads;
  const int64_t min_chunk = o.min_chunk_tokens;
  double total = 0;
  for (const uint64_t key : order) {
    const ChunkRun& run = runs[key & 0xffffffffu];
    total += run.count * o.cost.cost(1, run.len);
  }
  const double limit = total / units * (1 + 1e-12);  // A (rounding: equal fills count as fits)
  // The wrap's first level is M0 + alpha = A + alpha (step 3): a plain makespan already within
  // alpha of the mean is left as it is (most random batches: LPT is tight there; this skips
  // the tail's cost).
  const double plain_makespan = *std::max_element(plain_loads.begin(), plain_loads.end());
  if (plain_makespan <= total / units + alpha) return -1;
  // 1. Replay the greedy up to the first chunk that would end above A.
  sc.head_load.assign(static_cast<size_t>(units), 0.0);
  sc.head_count.assign(static_cast<size_t>(units), 0);
  int64_t head = -1, i = 0;
  size_t pos = 0;
  int k0 = 0;
  for (; pos < order.size() && head < 0; ++pos) {
    const ChunkRun& run = runs[order[pos] & 0xffffffffu];
    const double c = o.cost.cost(1, run.len);
    for (int k = 0; k < run.count; ++k, ++i) {
      const int u = unit_of[i];
      if (sc.head_load[u] + c > limit) {
        head = i;
        k0 = k;
        break;
      }
      sc.head_load[u] += c;
      ++sc.head_count[u];
    }
  }
  // Everything fits under A (nothing to balance), or the longest chunk alone exceeds it (only
  // cutting it would help: not the tail's business).
  if (head <= 0) return -1;
  --pos;  // the run holding the first tail chunk
  sc.tail_chunks.clear();
  double tail_total = 0;
  for (size_t p = pos; p < order.size(); ++p) {
    const ChunkRun& run = runs[order[p] & 0xffffffffu];
    for (int k = p == pos ? k0 : 0; k < run.count; ++k) {
      sc.tail_chunks.push_back(
          {run.request, run.kv_start + k * run.len, run.len, run.first_chunk + k, run.tile_chunks});
      tail_total += o.cost.cost(1, run.len);
    }
  }
  // 2. Units by head load, ties by index; the tail's water level M0.
  sc.unit_order.resize(static_cast<size_t>(units));
  for (int u = 0; u < units; ++u) sc.unit_order[u] = u;
  std::sort(sc.unit_order.begin(), sc.unit_order.end(), [&](int a, int b) {
    return sc.head_load[a] != sc.head_load[b] ? sc.head_load[a] < sc.head_load[b] : a < b;
  });
  double prefix = 0, level0 = 0;
  for (int j = 0; j < units; ++j) {
    prefix += sc.head_load[sc.unit_order[j]];
    level0 = (tail_total + prefix) / (j + 1);
    if (j + 1 == units || level0 <= sc.head_load[sc.unit_order[j + 1]]) break;
  }
  // Room for cuts within min(capacity, workspace bound) (comment above).
  const int64_t item_room = std::min<int64_t>(o.max_work_items, int64_t{batch} + units) - num_items;
  const int64_t slot_room = std::min<int64_t>(o.max_slots, 2 * int64_t{o.num_ctas}) - num_slots;
  sc.added.assign(static_cast<size_t>(batch), 0);
  sc.touched.clear();
  bool leftover = false;
  // The wrap at level M; returns its makespan (sc.pieces, sc.tail_load: the result). Without
  // `place_leftover`, running out of units ends it at once (leftover, makespan +inf).
  const auto wrap = [&](double level, bool place_leftover) {
    for (const int r : sc.touched) sc.added[r] = 0;
    sc.touched.clear();
    sc.pieces.clear();
    sc.tail_load = sc.head_load;
    leftover = false;
    int64_t items = 0, slots = 0;
    int at = 0;  // the unit being filled, in unit_order
    for (const PlanScratch::TailChunk& t : sc.tail_chunks) {
      const int base = t.chunk + sc.added[t.request];  // index of its first piece
      int start = t.kv_start, rest = t.len, cut = 0;
      for (;;) {
        const double c = o.cost.cost(1, rest);
        if (at == units) {  // out of units: whole, to the least-loaded one
          leftover = true;
          if (!place_leftover) return std::numeric_limits<double>::infinity();
          int u = 0;
          for (int v = 1; v < units; ++v) u = sc.tail_load[v] < sc.tail_load[u] ? v : u;
          sc.pieces.push_back({t.request, start, rest, base + cut, u, c});
          sc.tail_load[u] += c;
          break;
        }
        const int u = sc.unit_order[at];
        const double gap = level - sc.tail_load[u];
        if (c <= gap) {
          sc.pieces.push_back({t.request, start, rest, base + cut, u, c});
          sc.tail_load[u] += c;
          break;
        }
        const double fit =
            std::floor((gap - alpha) * inv_beta);  // tokens of a piece filling the gap
        if (fit >= static_cast<double>(min_chunk)) {
          const int64_t piece = std::min<int64_t>(static_cast<int64_t>(fit), rest - min_chunk);
          const int64_t more_slots =
              int64_t{heads} * (t.tile_chunks + sc.added[t.request] == 1 ? 2 : 1);
          if (piece >= min_chunk && items < item_room && slots + more_slots <= slot_room) {
            const double pc = o.cost.cost(1, piece);
            sc.pieces.push_back({t.request, start, static_cast<int>(piece), base + cut, u, pc});
            sc.tail_load[u] += pc;
            start += static_cast<int>(piece);
            rest -= static_cast<int>(piece);
            ++cut;
            ++items;
            slots += more_slots;
            if (sc.added[t.request]++ == 0) sc.touched.push_back(t.request);
          }
        }
        ++at;
      }
    }
    return *std::max_element(sc.tail_load.begin(), sc.tail_load.end());
  };
  // 3. The level: M0 + alpha first (about one cut per unit, each adding alpha to some unit: the
  // usual case), then M0 + 1.5 alpha, M0 + 2 alpha (D5 and D6 need ~1-1.3 alpha), then M0 + S,
  // which always places the tail (leftovers only where the room
  // for cuts ran out). A wrap costs ~30 cycles per tail chunk and unit: a search by halving
  // would cost a few microseconds of plan time for a few tokens of makespan.
  double best = plain_makespan;
  bool improved = false;
  const auto attempt = [&](double level, bool place_leftover) {
    const double makespan = wrap(level, place_leftover);
    if (makespan < best) {
      best = makespan;
      sc.best_pieces.swap(sc.pieces);
      improved = true;
    }
    return !leftover;
  };
  const double slack = 2 * alpha + beta * (2.0 * static_cast<double>(min_chunk) + 1);
  if (!attempt(level0 + alpha, false) && !attempt(level0 + 1.5 * alpha, false) &&
      !attempt(level0 + 2 * alpha, false)) {
    attempt(level0 + slack, true);
  }
  return improved ? head : -1;
}

}  // namespace flashkv::scheduler::detail
