// Rung 6: warptiling with float4 loads staged through registers into one shared-memory buffer.
#define NT THREADS
#include "common.cuh"
#include "tiles.cuh"
#include "warptile.cuh"
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
    const WarpPos p = warp_position();
    float total[FRAG_M][FRAG_N] = {{0.0f}}, acc[FRAG_M][FRAG_N] = {{0.0f}};
    for (int k0 = 0; k0 < K; k0 += BK) {
        load_a_tile(As, A, lda, M, K, row0, k0, vec_a);
        load_b_tile(Bs, B, ldb, N, K, col0, k0, vec_b);
        __syncthreads();
        warp_tile_mma(As, Bs, p, acc);
        __syncthreads();
        if (FOLD_AFTER(k0 / BK, BK)) fold_sums(total, acc);
    }
    fold_sums(total, acc);
    warp_tile_store(C, ldc, M, N, row0, col0, p, total, alpha, beta, vec_c, bias);
}
