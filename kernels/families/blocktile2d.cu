// Rung 4: 2D register blocking. Each thread computes a TM x TN outer product per k from
// register fragments; the A tile is stored transposed so a thread's TM values are contiguous.
#define NT ((BM / TM) * (BN / TN))
#include "common.cuh"
#include "blocked_sum.cuh"
extern "C" __global__ void __launch_bounds__(NT) gemm(GEMM_ARGS) {
    SELECT_BATCH_ENTRY();
    extern __shared__ float smem[];
    float* As = smem;            // [BK][BM] (transposed)
    float* Bs = smem + BK * BM;  // [BK][BN]
    int tile_m, tile_n;
    tile_coords(tile_m, tile_n, DIV_UP(M, BM), DIV_UP(N, BN), raster);
    const int row0 = tile_m * BM, col0 = tile_n * BN;
    const int tid = threadIdx.x;
    const int tc = tid % (BN / TN), tr = tid / (BN / TN);
    float total[TM][TN] = {{0.0f}}, acc[TM][TN] = {{0.0f}};
    float ra[TM], rb[TN];
    for (int k0 = 0; k0 < K; k0 += BK) {
        for (int i = tid; i < BM * BK; i += NT) {
            const int r = i / BK, c = i % BK;
            As[c * BM + r] = (row0 + r < M && k0 + c < K) ? A_AT(row0 + r, k0 + c) : 0.0f;
        }
        for (int i = tid; i < BK * BN; i += NT) {
            const int r = i / BN, c = i % BN;
            Bs[i] = (k0 + r < K && col0 + c < N) ? B_AT(k0 + r, col0 + c) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
#pragma unroll
            for (int i = 0; i < TM; ++i) ra[i] = As[kk * BM + tr * TM + i];
#pragma unroll
            for (int j = 0; j < TN; ++j) rb[j] = Bs[kk * BN + tc * TN + j];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] += ra[i] * rb[j];
        }
        __syncthreads();
        if (FOLD_AFTER(k0 / BK, BK)) fold_sums(total, acc);
    }
    fold_sums(total, acc);
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int row = row0 + tr * TM + i;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int col = col0 + tc * TN + j;
            if (row < M && col < N) {
                float* c = C + (size_t)row * ldc + col;
                *c = epilogue(total[i][j], alpha, beta, c, bias, col);
            }
        }
    }
}
