// What the CUDA C++ probes share (benchmarks/cluster_probe.cu, phase_probe.cu, mlp_probe.cu):
// PTX wrappers for mbarriers, 1-D bulk copies into shared memory, clusters, ldmatrix and bf16
// mma.sync; the 64 x 64 chunk layout the probes stream (16-byte granules swizzled by the row)
// and one chunk's MMA; a deterministic fill of test data; the host's timing and error measures;
// CHECK for the runtime calls. Each probe is built on its own with nvcc.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define CHECK(call)                                                                              \
  do {                                                                                           \
    cudaError_t err_ = (call);                                                                   \
    if (err_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

constexpr int KC = 64;  // a chunk is 64 rows x 64 values (8 KB of bf16), contiguous in memory

// element (r, k) of a chunk, its 16-byte granules swizzled by the row, so that a 1-D bulk copy
// lands it in shared memory ready for conflict-free ldmatrix
__host__ __device__ inline int swz(int r, int k) { return r * KC + (((k >> 3) ^ (r & 7)) << 3) + (k & 7); }

__device__ inline uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ inline void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}
// one arrival that also expects `bytes` of bulk-copy transactions before the phase completes
__device__ inline void mbar_expect_tx(uint32_t bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ inline void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// spins until the phase of parity `parity` has completed
__device__ inline void mbar_wait(uint32_t bar, int parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra WAIT_%=;\n}" ::"r"(bar), "r"(parity) : "memory");
}
// `bytes` from global memory into this CTA's shared memory, completing on mbarrier `bar`
__device__ inline void bulk_copy(uint32_t dst, const void* src, int bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
__device__ inline void ldmatrix_x4(uint32_t addr, uint32_t& a, uint32_t& b, uint32_t& c, uint32_t& d) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "r"(addr));
}
// c (16 x 8, float32) += a (16 x 16) b (16 x 8), bf16 operands in mma.sync's fragment layout
__device__ inline void mma_bf16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// one arrival on the mbarrier at the same shared-memory offset in cluster CTA `rank`
__device__ inline void mbar_arrive_cluster(uint32_t bar, int rank) {
  asm volatile(
      "{\n .reg .b32 remote;\n mapa.shared::cluster.u32 remote, %0, %1;\n"
      " mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n}" ::"r"(bar), "r"(rank) : "memory");
}
// every thread of every CTA of the cluster
__device__ inline void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ inline int cluster_rank() {
  int r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// acc (a warp's 16 rows mi x 32 columns nh, as 4 n8 tiles) += A chunk (rows) x W chunk (columns)^T,
// both swizzled 64 x 64 chunks in shared memory at a and w
__device__ inline void mma_chunk(float (&acc)[4][4], uint32_t a, uint32_t w, int mi, int nh, int lane) {
#pragma unroll
  for (int k16 = 0; k16 < KC / 16; ++k16) {
    uint32_t f[4];
    {  // matrices: rows 0-7 / 8-15 of the warp's 16, k 0-7 / 8-15 of this k16 step
      const int j = lane / 8, r = mi * 16 + (j % 2) * 8 + lane % 8, k = k16 * 16 + (j / 2) * 8;
      ldmatrix_x4(a + 2 * swz(r, k), f[0], f[1], f[2], f[3]);
    }
#pragma unroll
    for (int np = 0; np < 2; ++np) {  // two pairs of 8-column tiles
      const int j = lane / 8, n = nh * 32 + np * 16 + (j / 2) * 8 + lane % 8, k = k16 * 16 + (j % 2) * 8;
      uint32_t b0, b1, b2, b3;
      ldmatrix_x4(w + 2 * swz(n, k), b0, b1, b2, b3);
      mma_bf16(acc[np * 2], f, b0, b1);
      mma_bf16(acc[np * 2 + 1], f, b2, b3);
    }
  }
}

// deterministic pseudo-random bf16 in [-scale, scale), by element index (no host copy to build)
__global__ void fill_kernel(__nv_bfloat16* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed ^ static_cast<uint32_t>(i >> 32) * 40503u;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
    p[i] = __float2bfloat16(scale * (static_cast<float>(h >> 8) / 8388608.f - 1.f));
  }
}

// milliseconds a launch: `launch()` 3 times to warm up, then `reps` times between two events
template <typename Launch>
float ms_per_launch(Launch&& launch, int reps = 20) {
  cudaEvent_t start, end;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&end));
  for (int i = 0; i < 3; ++i) launch();
  CHECK(cudaEventRecord(start));
  for (int i = 0; i < reps; ++i) launch();
  CHECK(cudaEventRecord(end));
  CHECK(cudaEventSynchronize(end));
  CHECK(cudaGetLastError());
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, start, end));
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(end));
  return ms / reps;
}

// relative L2 error of got[0, n) against ref[0, n)
inline double rel_l2(const float* got, const float* ref, size_t n) {
  double e = 0, r = 0;
  for (size_t i = 0; i < n; ++i) e += (got[i] - ref[i]) * (got[i] - ref[i]), r += static_cast<double>(ref[i]) * ref[i];
  return std::sqrt(e / r);
}
