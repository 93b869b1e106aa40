// Rung 3: 1D register blocking. A block computes BM x BN; each thread a column strip of TM
// elements, reusing one B value from shared memory TM times.
#define NT (BM * BN / TM)
#include "common.cuh"
#include "blocked_sum.cuh"
extern "C" __global__ void __launch_bounds__(NT) gemm(GEMM_ARGS) {
    SELECT_BATCH_ENTRY();
    extern __shared__ float smem[];
    float* As = smem;            // [BM][BK]
    float* Bs = smem + BM * BK;  // [BK][BN]
    int tile_m, tile_n;
    tile_coords(tile_m, tile_n, DIV_UP(M, BM), DIV_UP(N, BN), 1);
    const int row0 = tile_m * BM, col0 = tile_n * BN;
    const int tid = threadIdx.x;
    const int tc = tid % BN, tr = tid / BN;
    float total[TM] = {0.0f}, acc[TM] = {0.0f};
    for (int k0 = 0; k0 < K; k0 += BK) {
        for (int i = tid; i < BM * BK; i += NT) {
            const int r = i / BK, c = i % BK;
            As[i] = (row0 + r < M && k0 + c < K) ? A_AT(row0 + r, k0 + c) : 0.0f;
        }
        for (int i = tid; i < BK * BN; i += NT) {
            const int r = i / BN, c = i % BN;
            Bs[i] = (k0 + r < K && col0 + c < N) ? B_AT(k0 + r, col0 + c) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            const float b = Bs[kk * BN + tc];
#pragma unroll
            for (int i = 0; i < TM; ++i) acc[i] += As[(tr * TM + i) * BK + kk] * b;
        }
        __syncthreads();
        if (FOLD_AFTER(k0 / BK, BK)) fold_sums(total, acc);
    }
    fold_sums(total, acc);
    const int col = col0 + tc;
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int row = row0 + tr * TM + i;
        if (row < M && col < N) {
            float* c = C + (size_t)row * ldc + col;
            *c = epilogue(total[i], alpha, beta, c, bias, col);
        }
    }
}
