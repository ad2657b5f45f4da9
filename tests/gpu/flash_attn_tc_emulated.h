// The tensor-core flash-attention kernels (csrc/ops/gpu/flash_attn_tc_kernels.cuh)
// run on the CPU by tests/gpu/warp_emulator.h: what kernels_check.cc compares
// with the CPU kernels where no GPU is (and where one is, too). Host pointers;
// the same launch plan (run_forward / run_backward) as the CUDA launcher.
#pragma once

#include "flash_attn.h"

namespace gpu_check {

// Whether the tensor-core kernels take a call of this kind and head dim.
bool tc_kernels_take(const paddle_ext::flash_attn::Problem& p);

void tc_emulated_forward(const paddle_ext::flash_attn::Problem& p, const void* q, const void* k, const void* v,
                         void* out, float* lse);

// deterministic: dQ by the recomputing kernel, else by atomics (the default on
// a GPU). The workspace is the function's own, NaN-filled first.
void tc_emulated_backward(const paddle_ext::flash_attn::Problem& p, const void* q, const void* k, const void* v,
                          const void* out, const void* dout, const float* lse, void* dq, void* dk, void* dv,
                          bool deterministic);

}  // namespace gpu_check
