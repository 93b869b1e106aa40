// Rung 5: 2D register blocking with float4 global loads and stores, the A tile stored transposed
// and padded (PADA/PADB) in shared memory, and float4 fragment reads from shared memory.
#define NT ((BM / TM) * (BN / TN))
#include "common.cuh"
#include "tiles.cuh"
#include "blocked_sum.cuh"
extern "C" __global__ void __launch_bounds__(NT) gemm(GEMM_ARGS) {
    extern __shared__ __align__(16) float smem[];
    SELECT_BATCH_ENTRY();
    float* As = smem;
    float* Bs = smem + A_TILE_FLOATS;
    int tile_m, tile_n;
    tile_coords(tile_m, tile_n, DIV_UP(M, BM), DIV_UP(N, BN), raster);
    const int row0 = tile_m * BM, col0 = tile_n * BN;
    const bool vec_a = (lda % 4 == 0) && aligned16(A);
    const bool vec_b = (ldb % 4 == 0) && aligned16(B);
    const bool vec_c = (ldc % 4 == 0) && aligned16(C);
    const int tc = threadIdx.x % (BN / TN), tr = threadIdx.x / (BN / TN);
    float total[TM][TN] = {{0.0f}}, acc[TM][TN] = {{0.0f}};
    float ra[TM], rb[TN];
    for (int k0 = 0; k0 < K; k0 += BK) {
        load_a_tile(As, A, lda, M, K, row0, k0, vec_a);
        load_b_tile(Bs, B, ldb, N, K, col0, k0, vec_b);
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
#pragma unroll
            for (int i = 0; i < TM; i += 4)
                *reinterpret_cast<float4*>(ra + i) = *reinterpret_cast<const float4*>(As + kk * LDA_S + tr * TM + i);
#pragma unroll
            for (int j = 0; j < TN; j += 4)
                *reinterpret_cast<float4*>(rb + j) = *reinterpret_cast<const float4*>(Bs + kk * LDB_S + tc * TN + j);
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
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; j += 4)
            store4(C, ldc, M, N, row0 + tr * TM + i, col0 + tc * TN + j, &total[i][j], alpha, beta, vec_c, bias);
}
