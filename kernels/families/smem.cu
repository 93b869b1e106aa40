#include "common.cuh"
#include "blocked_sum.cuh"
// Rung 2: square TILE x TILE tiles of A and B staged in shared memory; one thread per element.
extern "C" __global__ void __launch_bounds__(TILE * TILE) gemm(GEMM_ARGS) {
    SELECT_BATCH_ENTRY();
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int tile_m, tile_n;
    tile_coords(tile_m, tile_n, DIV_UP(M, TILE), DIV_UP(N, TILE), 1);
    const int tx = threadIdx.x % TILE, ty = threadIdx.x / TILE;
    const int row = tile_m * TILE + ty, col = tile_n * TILE + tx;
    float total = 0.0f, acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        As[ty][tx] = (row < M && k0 + tx < K) ? A_AT(row, k0 + tx) : 0.0f;
        Bs[ty][tx] = (k0 + ty < K && col < N) ? B_AT(k0 + ty, col) : 0.0f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TILE; ++kk) acc += As[ty][kk] * Bs[kk][tx];
        __syncthreads();
        if (FOLD_AFTER(k0 / TILE, TILE)) fold_sums(total, acc);
    }
    fold_sums(total, acc);
    if (row < M && col < N) {
        float* c = C + (size_t)row * ldc + col;
        *c = epilogue(total, alpha, beta, c, bias, col);
    }
}
