// flashkv: attention over paged KV caches for LLM serving. The umbrella header.
#pragma once

#include "flashkv/attention.h"
#include "flashkv/decode.h"
#include "flashkv/dtype.h"
#include "flashkv/error.h"
#include "flashkv/host_tensor.h"
#include "flashkv/jit.h"
#include "flashkv/kv_ops.h"
#include "flashkv/merge.h"
#include "flashkv/paged_kv.h"
#include "flashkv/prefill.h"
#include "flashkv/reference.h"
#include "flashkv/reference_kv_ops.h"
#include "flashkv/rope.h"
#include "flashkv/runtime.h"
#include "flashkv/tensor.h"
#include "flashkv/variants.h"
