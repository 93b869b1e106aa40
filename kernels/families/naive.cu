#include "common.cuh"
#include "blocked_sum.cuh"
// Rung 1: one thread per element of C. COALESCED = 1 puts consecutive threads on consecutive
// columns (coalesced loads of B and stores of C); COALESCED = 0 puts them on consecutive rows.
extern "C" __global__ void __launch_bounds__(BX * BY) gemm(GEMM_ARGS) {
    SELECT_BATCH_ENTRY();
    int tile_m, tile_n;
#if COALESCED
    tile_coords(tile_m, tile_n, DIV_UP(M, BY), DIV_UP(N, BX), 1);
    const int row = tile_m * BY + threadIdx.x / BX;
    const int col = tile_n * BX + threadIdx.x % BX;
#else
    tile_coords(tile_m, tile_n, DIV_UP(M, BX), DIV_UP(N, BY), 1);
    const int row = tile_m * BX + threadIdx.x % BX;
    const int col = tile_n * BY + threadIdx.x / BX;
#endif
    if (row >= M || col >= N) return;
    float total = 0.0f;
    for (int k0 = 0; k0 < K; k0 += SUM_CHUNK) {
        float part = 0.0f;
        for (int k = k0; k < min(K, k0 + SUM_CHUNK); ++k) part += A_AT(row, k) * B_AT(k, col);
        total += part;
    }
    float* c = C + (size_t)row * ldc + col;
    *c = epilogue(total, alpha, beta, c, bias, col);
}
