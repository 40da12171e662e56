// Vocabulary parallel (graph::VocabSplit, docs/DISTRIBUTED.md "Tensor parallel"): what every backend's vocabulary
// kernels share. A rank holds rows [offset, offset + V) of the lm_head; its kernels compute per-row statistics over
// those rows, and combine_vocab_rows turns them into the whole vocabulary's with one all-reduce over the group.
#pragma once

#include <cstdint>

#include "trl/graph/graph.h"

namespace trl {

// Target id t (of the whole vocabulary) as a row of this rank's part: t − offset, which lies outside [0, V) when
// another rank holds the target (so a kernel's "is the target in this chunk" test is simply false for it).
inline int32_t local_target(const graph::VocabSplit& s, int32_t t) { return s.split() ? static_cast<int32_t>(t - s.offset) : t; }
// The number of rows of the whole vocabulary (`rows` of this rank's part without a split).
inline int64_t whole_vocab(const graph::VocabSplit& s, int64_t rows) { return s.split() ? s.size : rows; }

// The per-row statistics of rows r < R, in place. In: over this rank's part of the vocabulary (the whole vocabulary
// without a split),
//   lse[r] = log Σ e^z,  ez[r] = Σ softmax(z)·z,  zt[r] = z[target] (where this rank holds the target),
//   mx[r] = max z,       first[r] = 1 where this rank holds the target and it is the first index of max z, else 0.
// Out, over the whole vocabulary: lse[r], ez[r] = the entropy lse − Σ p·z, zt[r] = log p(target) and first[r] = 1
// where the target is the first index of the largest logit (ties across ranks go to the lower rank, as one argmax
// over the whole vocabulary would). ez, and zt/mx/first without targets, may be null. With a split, every rank of
// the group calls it with its part (one all-reduce of ranks × 5 × R doubles over collective split.group).
void combine_vocab_rows(const graph::VocabSplit& split, int64_t rows_per_rank, int64_t R, const int32_t* targets, double* lse, double* ez, double* zt,
                        double* mx, double* first);

}  // namespace trl
