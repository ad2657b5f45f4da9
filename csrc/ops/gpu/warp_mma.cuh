// The warp-level primitives of the tensor-core flash-attention kernels
// (gpu/flash_attn_tc_kernels.cuh), for CUDA sm_80 and newer: mma.sync
// m16n8k16 (bf16 / fp16 in, fp32 accumulate), ldmatrix, cp.async with zero
// fill, shuffles, float atomics, the block barrier and the dynamic shared
// memory.
//
// The kernels see nothing of CUDA but these names, so the same kernel source
// also runs on a CPU under tests/gpu/warp_emulator.h, which implements every
// one of them from the PTX ISA's definitions (fragment layouts included):
// that is how the kernels' index arithmetic is tested where no GPU is.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"), lane =
// 4 * g + t: A (16 x 16, row-major) a0 = (g, 2t..2t+1), a1 = (g+8, 2t..),
// a2 = (g, 2t+8..), a3 = (g+8, 2t+8..); B (16 x 8) b0 = (k 2t..2t+1, n g),
// b1 = (k 2t+8.., n g); C (16 x 8) c0, c1 = (g, 2t), (g, 2t+1), c2, c3 the
// same in row g+8. The lower 16 bits of a packed pair hold the lower index.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#if !defined(__CUDACC__)
#error "gpu/warp_mma.cuh is CUDA device code; the CPU emulation is tests/gpu/warp_emulator.h"
#endif

#define PE_TC_DEVICE __device__ __forceinline__
#define PE_TC_KERNEL __global__ __launch_bounds__(128)
#define PE_TC_UNROLL _Pragma("unroll")
#define PE_TC_TARGET on_cuda  // the kernels' inline namespace (gpu/flash_attn_tc_kernels.cuh)

namespace paddle_ext::flash_attn::tc {

PE_TC_DEVICE int thread_rank() { return static_cast<int>(threadIdx.x); }
PE_TC_DEVICE int64_t block_x() { return blockIdx.x; }
PE_TC_DEVICE int64_t block_y() { return blockIdx.y; }
PE_TC_DEVICE int64_t block_z() { return blockIdx.z; }

PE_TC_DEVICE char* dynamic_smem() {
  extern __shared__ __align__(16) char smem[];
  return smem;
}

PE_TC_DEVICE void block_sync() { __syncthreads(); }

PE_TC_DEVICE float shfl_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask, 32); }

// 4-byte stores to / loads from shared memory that ldmatrix / cp.async do not
// cover: primitives, so that the emulator's race check sees every shared access.
PE_TC_DEVICE void st_shared_u32(void* p, uint32_t v) { *static_cast<uint32_t*>(p) = v; }
PE_TC_DEVICE void st_shared_f32(float* p, float v) { *p = v; }
PE_TC_DEVICE float ld_shared_f32(const float* p) { return *p; }

// p[0] += a, p[1] += b in global memory, atomically (results unused: red.global.add);
// p 8-byte aligned. sm_90 has the two-float form, one instruction instead of two.
PE_TC_DEVICE void atomic_add2(float* p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(p), make_float2(a, b));
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
#endif
}

// 2^x by the SFU (ex2.approx.ftz: relative error about 2^-22; 2^-inf = 0):
// what flash-attention gets from --use_fast_math, here only where it is wanted.
PE_TC_DEVICE float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// d += a * b for one 16 x 8 x 16 tile; kBf16 picks bf16 or fp16 inputs.
template <bool kBf16>
PE_TC_DEVICE void mma_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#else
  __trap();  // the dispatcher never launches these kernels below sm_80
#endif
}

// Two floats rounded to nearest even, as a packed pair (lo in the low half).
template <bool kBf16>
PE_TC_DEVICE uint32_t pack2(float lo, float hi) {
  uint32_t bits;
  if constexpr (kBf16) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    __builtin_memcpy(&bits, &v, sizeof bits);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    __builtin_memcpy(&bits, &v, sizeof bits);
  }
  return bits;
}

PE_TC_DEVICE uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8 x 8 b16 matrices: lanes 8i..8i+7 give the row addresses of matrix i,
// r[i] gets lane (g, t)'s pair (row g, columns 2t, 2t+1) of it.
PE_TC_DEVICE void ldmatrix_x4(uint32_t r[4], const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row)));
#else
  __trap();
#endif
}

// The same, transposed: r[i] gets (rows 2t, 2t+1, column g) of matrix i.
PE_TC_DEVICE void ldmatrix_x4_trans(uint32_t r[4], const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row)));
#else
  __trap();
#endif
}

// 16 bytes global -> shared, asynchronous; zeros where !valid (nothing is read).
PE_TC_DEVICE void cp_async_16(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src),
               "r"(valid ? 16 : 0));
#else
  __trap();
#endif
}

PE_TC_DEVICE void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits until at most kPending of this thread's committed groups are in flight.
template <int kPending>
PE_TC_DEVICE void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
#endif
}

}  // namespace paddle_ext::flash_attn::tc
