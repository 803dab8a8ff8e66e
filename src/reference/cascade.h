// Internals of the cascade reference (cascade.cpp): the merged states in double, before the one
// rounding into the output, for tests that compare at double precision. Not a public header.
#pragma once

#include <span>
#include <vector>

#include "flashkv/reference_cascade.h"
#include "reference/attend.h"

namespace flashkv::reference::detail {

// (O, LSE) of every (row, qo head) after ⊕ over the levels, row-major [nnz_qo][H_qo]. Validates
// the arguments as multi_level_cascade() does (out/lse are not needed).
std::vector<RowState> cascade_states(const TensorView& q, const TensorView& k, const TensorView& v,
                                     KVLayout layout, std::span<const CascadeLevelView> levels,
                                     const AttentionOptions& opts);

// ⊕ of states in double (the formula of merge.cpp: max trick; empty states are skipped).
RowState merge_row_states(std::span<const RowState> states);

}  // namespace flashkv::reference::detail
