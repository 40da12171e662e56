#include "backend/vocab_parallel.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "trl/core/collectives.h"

namespace trl {

void combine_vocab_rows(const graph::VocabSplit& split, int64_t rows_per_rank, int64_t R, const int32_t* targets, double* lse, double* ez, double* zt,
                        double* mx, double* first) {
  if (!split.split()) {
    for (int64_t r = 0; r < R; ++r) {
      if (ez) ez[r] = lse[r] - ez[r];
      if (targets) zt[r] -= lse[r];
    }
    return;
  }
  // Every rank's five rows of statistics, gathered by a sum into which each rank writes only its own slot.
  const int64_t ranks = split.size / rows_per_rank, me = split.offset / rows_per_rank, slot = 5 * R;
  std::vector<double> all(static_cast<size_t>(ranks * slot), 0.0);
  double* own = all.data() + me * slot;
  for (int64_t r = 0; r < R; ++r) {
    own[r] = lse[r];
    own[R + r] = ez ? ez[r] : 0.0;
    if (targets) own[2 * R + r] = zt[r], own[3 * R + r] = mx[r], own[4 * R + r] = first[r];
  }
  all_reduce_in_group(split.group, all.data(), static_cast<int64_t>(all.size()), DType::F64);
  auto at = [&](int64_t rank, int64_t row, int64_t r) { return all[static_cast<size_t>(rank * slot + row * R + r)]; };
  for (int64_t r = 0; r < R; ++r) {
    double m = -INFINITY;
    for (int64_t k = 0; k < ranks; ++k) m = std::max(m, at(k, 0, r));
    double s = 0;
    for (int64_t k = 0; k < ranks; ++k) s += std::exp(at(k, 0, r) - m);
    const double whole = m + std::log(s);
    lse[r] = whole;
    if (ez) {  // H = lse − Σ_k (share of rank k) · (its mean logit)
      double mean = 0;
      for (int64_t k = 0; k < ranks; ++k) mean += std::exp(at(k, 0, r) - whole) * at(k, 1, r);
      ez[r] = whole - mean;
    }
    if (!targets) continue;
    const int64_t owner = targets[r] / rows_per_rank;
    const double z = at(owner, 2, r);
    zt[r] = z - whole;
    bool match = at(owner, 4, r) > 0;
    for (int64_t k = 0; k < ranks && match; ++k) match = k < owner ? at(k, 3, r) < z : k > owner ? at(k, 3, r) <= z : true;
    first[r] = match ? 1.0 : 0.0;
  }
}

}  // namespace trl
