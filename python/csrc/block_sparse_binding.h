// Block-sparse attention from Python (flashkv/block_sparse.h): _C.BlockSparseAttention (the GPU
// op), _C.reference_block_sparse_attention (its CPU reference) and _C.block_sparse_mask_bytes.
#pragma once

#include "array_view.h"

namespace flashkv::python {

void bind_block_sparse(nb::module_& m);

}  // namespace flashkv::python
