// The tensor-core flash-attention backend (gpu/flash_attn_tc.cu, CUDA sm_80+),
// which gpu/flash_attn.cu hands the calls it takes. No Paddle header.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "flash_attn.h"

namespace paddle_ext::flash_attn::tc {

// Whether the tensor-core kernels take this call on the current device:
// bf16 / fp16, head dim 32, 64, 96 or 128, every tensor 16-byte aligned, a
// device of compute capability 8.0 or newer with the shared memory they ask
// for, and PADDLE_EXT_FLASH_ATTN_GPU_KERNEL not "simple" (which forces the
// simple kernels of gpu/flash_attn.cu, for comparisons).
bool takes(const Problem& p, std::initializer_list<const void*> tensors);

void forward(const Problem& p, const void* q, const void* k, const void* v, void* out, float* lse, void* stream);

// Bytes of device memory backward's `workspace` needs (the float32 dQ
// included, for the default DqMode::kAtomic); 0 for a call they never take.
int64_t backward_workspace_bytes(const Problem& p);

// dQ by atomics (FlashAttention-2's way; its last bits vary from run to run),
// or, with PADDLE_EXT_FLASH_ATTN_GPU_KERNEL=deterministic or Paddle's
// FLAGS_cudnn_deterministic set in the environment, by a second kernel that
// recomputes S and dP (the same bits every run, 7 GEMMs a tile pair instead of 5).
void backward(const Problem& p, const void* q, const void* k, const void* v, const void* out, const void* dout,
              const float* lse, void* dq, void* dk, void* dv, void* workspace, void* stream);

}  // namespace paddle_ext::flash_attn::tc
