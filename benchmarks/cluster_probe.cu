// Does one L2 read feeding several SMs raise what the step kernel's matmul tasks can stream?
//
// The step kernel (vlaperf/engine/kernels/expert_step.py) gives each of 128 programs a tile
// of weight rows and has every program read the whole activation block (64 rows x K) from
// L2: 102 MB a layer go through L2 for 34.6 MB of weights (docs/perf-notes.md, session 7),
// and a program ingests 20-68 KB a microsecond. Plain Triton cannot share one read between
// SMs. This probe streams gate_up's shape the way a CUDA C++ step kernel would, with the
// activation block either read by every CTA (cluster 1) or read once per cluster of 2 or 4
// CTAs and multicast into all of their shared memories (cp.async.bulk ... multicast::cluster),
// and reports the time a layer and the bytes a CTA takes in a microsecond.
//
// Shape (pi0's expert gate_up, one sample): y (64 x 8192) = x (64 x 1024) @ W^T, W (8192 x
// 1024), bf16, float32 accumulation, 18 layers, each with its own x and W, one launch for all.
// 128 CTAs of 256 threads, each owning 64 output columns; K in chunks of 64. Both operands are
// stored in global memory chunk by chunk (64 rows x 64 values, 8 KB, contiguous) with the
// 16-byte granules of each row XOR-swizzled by the row, so a 1-D bulk copy lands them in shared
// memory ready for conflict-free ldmatrix; the step kernel's writers could store activations
// that way, and the weights are permuted once, offline.
//
// Build and run on the H200 machine (nvcc 13.0 is there):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o /tmp/cluster_probe benchmarks/cluster_probe.cu
//   /tmp/cluster_probe            # cluster 1, 2, 4 at 4 and 8 stages, with and without a producer
//                                 # warp; checks every output
// Prints one row per variant: us a layer, weights TB/s, KB a CTA takes in a microsecond, and the
// largest error against a plain float32 reference kernel. Prepared in session 9, run in
// session 10 (benchmarks/results/h200/cluster_probe.txt; docs/perf-notes.md, version 43), and with
// the resident clusters printed in session 11 (cluster_probe_residency.txt: clusters of 2 all
// resident and still 2x slower; of 4, 30 of 32 resident).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "probe_ptx.cuh"  // the chunk layout, PTX wrappers, one chunk's MMA, fill_kernel, CHECK

constexpr int L = 18, M = 64, K = 1024, N = 8192, CHUNKS = K / KC, TILE_N = 64, CTAS = N / TILE_N;
constexpr int THREADS = 256;  // the 8 MMA warps; WS adds a ninth, the producer
constexpr int CHUNK_ELEMS = 64 * KC;            // one 64 x 64 chunk of x or of a CTA's W tile
constexpr int CHUNK_BYTES = CHUNK_ELEMS * 2;    // 8 KB
constexpr int STAGE_BYTES = 2 * CHUNK_BYTES;    // x chunk, then W chunk

__device__ inline void bulk_copy_multicast(uint32_t dst, const void* src, int bytes, uint32_t bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], %4;"
      ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "h"(mask) : "memory");
}

// xp: [L][CHUNKS] chunks of x (64 rows); wp: [L][CTAS][CHUNKS] chunks of W (the CTA's 64 rows);
// y: [L][M][N] bf16. CLUSTER CTAs share each x chunk: CTA rank r fetches rows [r*64/C, (r+1)*64/C)
// of it and multicasts them to every CTA of the cluster. WS: a ninth warp only issues the copies
// (warp specialization); without it thread 0 issues them between its own MMA work.
template <int CLUSTER, int STAGES, bool WS>
__global__ void __launch_bounds__(THREADS + 32) stream_kernel(const __nv_bfloat16* __restrict__ xp,
                                                         const __nv_bfloat16* __restrict__ wp,
                                                         __nv_bfloat16* __restrict__ y) {
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + STAGES * STAGE_BYTES);
  uint64_t* empty = full + STAGES;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int cta = blockIdx.x, rank = CLUSTER > 1 ? cluster_rank() : 0;
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(smem_addr(&full[s]), 1);        // the local producer's arrive.expect_tx
      mbar_init(smem_addr(&empty[s]), WS ? CLUSTER * 8 : CLUSTER);  // every CTA (WS: every MMA warp) of the cluster has read stage s
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if (CLUSTER > 1) cluster_sync(); else __syncthreads();

  constexpr int TOTAL = L * CHUNKS;
  constexpr int PART_BYTES = CHUNK_BYTES / CLUSTER;  // rows 64 / CLUSTER of an x chunk
  auto produce = [&](int g) {                        // thread 0 only: chunk g into stage g % STAGES
    const int s = g % STAGES, layer = g / CHUNKS, kc = g % CHUNKS;
    const uint32_t bar = smem_addr(&full[s]);
    const uint32_t xs = smem_addr(smem + s * STAGE_BYTES), ws = xs + CHUNK_BYTES;
    mbar_expect_tx(bar, STAGE_BYTES);  // the whole x chunk (all ranks' parts) and this CTA's W chunk
    bulk_copy(ws, wp + (static_cast<size_t>(layer * CTAS + cta) * CHUNKS + kc) * CHUNK_ELEMS, CHUNK_BYTES, bar);
    const __nv_bfloat16* xsrc = xp + static_cast<size_t>(layer * CHUNKS + kc) * CHUNK_ELEMS;
    if (CLUSTER == 1) {
      bulk_copy(xs, xsrc, CHUNK_BYTES, bar);
    } else {
      bulk_copy_multicast(xs + rank * PART_BYTES, xsrc + rank * (CHUNK_ELEMS / CLUSTER), PART_BYTES, bar,
                          static_cast<uint16_t>((1 << CLUSTER) - 1));
    }
  };
  if (WS && warp == 8) {  // the producer warp: one lane issues every copy, gated by the stage's release
    if (lane == 0)
      for (int g = 0; g < TOTAL; ++g) {
        if (g >= STAGES) mbar_wait(smem_addr(&empty[g % STAGES]), (g / STAGES - 1) & 1);
        produce(g);
      }
    __syncwarp();  // the cluster barrier is .aligned: the whole warp arrives together
    if (CLUSTER > 1) cluster_sync();
    return;
  }
  if (!WS && tid == 0)
    for (int g = 0; g < STAGES && g < TOTAL; ++g) produce(g);

  const int mi = warp % 4, nh = warp / 4;  // 16 rows of x, 32 of the CTA's 64 columns
  float acc[4][4];
  for (int g = 0; g < TOTAL; ++g) {
    const int s = g % STAGES, kc = g % CHUNKS;
    if (kc == 0)
      for (auto& t : acc) t[0] = t[1] = t[2] = t[3] = 0.f;
    mbar_wait(smem_addr(&full[s]), (g / STAGES) & 1);
    const uint32_t xs = smem_addr(smem + s * STAGE_BYTES), ws = xs + CHUNK_BYTES;
    mma_chunk(acc, xs, ws, mi, nh, lane);
    if (WS) {  // each MMA warp releases stage s in every cluster CTA on its own
      __syncwarp();
      if (lane == 0)
        for (int c = 0; c < CLUSTER; ++c) {
          if (CLUSTER > 1) mbar_arrive_cluster(smem_addr(&empty[s]), c);
          else asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(&empty[s])) : "memory");
        }
    } else {
    __syncthreads();  // every warp is done with stage s here
    if (tid == 0) {
      for (int c = 0; c < CLUSTER; ++c) {  // tell every producer writing into our stage s
        if (CLUSTER > 1) mbar_arrive_cluster(smem_addr(&empty[s]), c);
        else asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(&empty[s])) : "memory");
      }
      if (g + STAGES < TOTAL) {
        mbar_wait(smem_addr(&empty[s]), (g / STAGES) & 1);  // every cluster CTA has read its stage s
        produce(g + STAGES);
      }
    }
    }
    if (kc == CHUNKS - 1) {  // the layer's 64 x 64 output tile
      const int layer = g / CHUNKS;
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const int col = cta * TILE_N + nh * 32 + t * 8 + (lane % 4) * 2;
        const int row = mi * 16 + lane / 4;
        __nv_bfloat16* out = y + (static_cast<size_t>(layer) * M + row) * N + col;
        *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(acc[t][0], acc[t][1]);
        *reinterpret_cast<__nv_bfloat162*>(out + 8 * N) = __floats2bfloat162_rn(acc[t][2], acc[t][3]);
      }
    }
  }
  __syncwarp();
  if (CLUSTER > 1) cluster_sync();  // no CTA leaves while a peer may still arrive on its barriers
}

// one output column a thread, all 64 rows: each weight is read once, x's values are warp broadcasts
__global__ void reference_kernel(const __nv_bfloat16* x, const __nv_bfloat16* w, float* y) {
  const int layer = blockIdx.y, n = blockIdx.x * blockDim.x + threadIdx.x;
  float s[M] = {};
  for (int k = 0; k < K; ++k) {
    const float wk = __bfloat162float(w[(static_cast<size_t>(layer) * N + n) * K + k]);
#pragma unroll
    for (int m = 0; m < M; ++m) s[m] += __bfloat162float(x[(static_cast<size_t>(layer) * M + m) * K + k]) * wk;
  }
  for (int m = 0; m < M; ++m) y[(static_cast<size_t>(layer) * M + m) * N + n] = s[m];
}

template <int CLUSTER, int STAGES, bool WS>
void run(const __nv_bfloat16* xp, const __nv_bfloat16* wp, __nv_bfloat16* y, const std::vector<float>& ref) {
  // at least 120 KB, so that one CTA fits an SM as in the step kernel (one program per SM):
  // with 4 stages' 64 KB the scheduler could otherwise put several CTAs on one SM
  const int smem = std::max(STAGES * STAGE_BYTES + 2 * STAGES * 8, 120 * 1024);
  auto kernel = stream_kernel<CLUSTER, STAGES, WS>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  if (CLUSTER > 1) CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(CTAS);
  cfg.blockDim = dim3(THREADS + (WS ? 32 : 0));
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = CLUSTER;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int resident = 0;  // clusters resident at once: fewer than CTAS / CLUSTER means more than one wave
  CHECK(cudaOccupancyMaxActiveClusters(&resident, kernel, &cfg));
  CHECK(cudaMemset(y, 0xff, static_cast<size_t>(L) * M * N * 2));  // poison: every output must be written
  CHECK(cudaLaunchKernelEx(&cfg, kernel, xp, wp, y));
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::vector<__nv_bfloat16> got(static_cast<size_t>(L) * M * N);
  CHECK(cudaMemcpy(got.data(), y, got.size() * 2, cudaMemcpyDeviceToHost));
  double max_err = 0, ref_norm = 0, err_norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = static_cast<double>(__bfloat162float(got[i])) - ref[i];
    max_err = std::fmax(max_err, std::fabs(d));
    err_norm += d * d;
    ref_norm += static_cast<double>(ref[i]) * ref[i];
  }
  const double us_layer = ms_per_launch([&] { CHECK(cudaLaunchKernelEx(&cfg, kernel, xp, wp, y)); }) * 1e3 / L;
  const double w_bytes = static_cast<double>(N) * K * 2, per_cta = (static_cast<double>(M) * K * 2 / CLUSTER + w_bytes / CTAS);
  std::printf("(%d of %d clusters resident at once)  ", resident, CTAS / CLUSTER);
  std::printf("cluster %d  stages %d  %s  %8.2f us a layer  weights %5.2f TB/s  %6.1f KB/us a CTA (own reads)  "
              "rel L2 %.2e  max abs %.3e\n",
              CLUSTER, STAGES, WS ? "producer warp" : "thread 0 copies", us_layer, w_bytes / us_layer / 1e6, per_cta / us_layer / 1e3,
              std::sqrt(err_norm / ref_norm), max_err);
}

int main() {
  std::mt19937 gen(0);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<__nv_bfloat16> x(static_cast<size_t>(L) * M * K), w(static_cast<size_t>(L) * N * K);
  for (auto& v : x) v = __float2bfloat16(dist(gen));
  for (auto& v : w) v = __float2bfloat16(dist(gen) / 32.f);
  // the chunked, swizzled copies the kernel streams
  std::vector<__nv_bfloat16> xp(x.size()), wp(w.size());
  for (int l = 0; l < L; ++l)
    for (int m = 0; m < M; ++m)
      for (int k = 0; k < K; ++k)
        xp[(static_cast<size_t>(l) * CHUNKS + k / KC) * CHUNK_ELEMS + swz(m, k % KC)] =
            x[(static_cast<size_t>(l) * M + m) * K + k];
  for (int l = 0; l < L; ++l)
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < K; ++k)
        wp[((static_cast<size_t>(l) * CTAS + n / TILE_N) * CHUNKS + k / KC) * CHUNK_ELEMS + swz(n % TILE_N, k % KC)] =
            w[(static_cast<size_t>(l) * N + n) * K + k];
  __nv_bfloat16 *dx, *dw, *dxp, *dwp, *dy;
  float* dref;
  CHECK(cudaMalloc(&dx, x.size() * 2));
  CHECK(cudaMalloc(&dw, w.size() * 2));
  CHECK(cudaMalloc(&dxp, xp.size() * 2));
  CHECK(cudaMalloc(&dwp, wp.size() * 2));
  CHECK(cudaMalloc(&dy, static_cast<size_t>(L) * M * N * 2));
  CHECK(cudaMalloc(&dref, static_cast<size_t>(L) * M * N * 4));
  CHECK(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dxp, xp.data(), xp.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dwp, wp.data(), wp.size() * 2, cudaMemcpyHostToDevice));
  reference_kernel<<<dim3(N / 128, L), 128>>>(dx, dw, dref);
  CHECK(cudaGetLastError());
  std::vector<float> ref(static_cast<size_t>(L) * M * N);
  CHECK(cudaMemcpy(ref.data(), dref, ref.size() * 4, cudaMemcpyDeviceToHost));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs; y (%d x %d) = x (%d x %d) @ W^T, %d layers, %d CTAs x %d columns\n", prop.name,
              prop.multiProcessorCount, M, N, M, K, L, CTAS, TILE_N);
  run<1, 4, false>(dxp, dwp, dy, ref);
  run<2, 4, false>(dxp, dwp, dy, ref);
  run<4, 4, false>(dxp, dwp, dy, ref);
  run<1, 8, false>(dxp, dwp, dy, ref);
  run<2, 8, false>(dxp, dwp, dy, ref);
  run<4, 8, false>(dxp, dwp, dy, ref);
  run<1, 8, true>(dxp, dwp, dy, ref);
  run<2, 8, true>(dxp, dwp, dy, ref);
  run<4, 8, true>(dxp, dwp, dy, ref);
  return 0;
}
