// Rungs 7-8: warptiling fed by a STAGES-deep ring of shared-memory tiles filled with cp.async,
// so loads of tile t+STAGES-1 overlap the FFMAs of tile t. With SPLIT (splitk family), blockIdx.z takes
// one of `splits` slices of K and writes raw partial sums to workspace; gemm_splitk_reduce applies alpha/beta.
#define NT THREADS
#include "common.cuh"
#include "tiles.cuh"
#include "warptile.cuh"
#include "blocked_sum.cuh"
extern "C" __global__ void __launch_bounds__(NT) gemm(GEMM_ARGS) {
    extern __shared__ __align__(16) float smem[];
    SELECT_BATCH_ENTRY();
    int tile_m, tile_n;
    tile_coords(tile_m, tile_n, DIV_UP(M, BM), DIV_UP(N, BN), raster);
    const int row0 = tile_m * BM, col0 = tile_n * BN;
    const bool vec_a = (lda % 4 == 0) && aligned16(A);
    const bool vec_b = (ldb % 4 == 0) && aligned16(B);
    // Each split takes a whole number of BK tiles.
    const int k_chunk = DIV_UP(DIV_UP(K, SLICES), BK) * BK;
    const int k_begin = SLICE * k_chunk;
    const int k_end = min(K, k_begin + k_chunk);
    const int ktiles = k_begin < k_end ? DIV_UP(k_end - k_begin, BK) : 0;
    const WarpPos p = warp_position();
    float total[FRAG_M][FRAG_N] = {{0.0f}}, acc[FRAG_M][FRAG_N] = {{0.0f}};

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < ktiles) {
            float* As = smem + s * (A_TILE_FLOATS + B_TILE_FLOATS);
            load_a_tile_async(As, A, lda, M, row0, k_begin + s * BK, k_end, vec_a);
            load_b_tile_async(As + A_TILE_FLOATS, B, ldb, N, col0, k_begin + s * BK, k_end, vec_b);
        }
        cp_async_commit();
    }
    for (int t = 0; t < ktiles; ++t) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();  // tile t visible to all; everyone is done with the stage refilled below
        const int next = t + STAGES - 1;
        if (next < ktiles) {
            float* As = smem + (next % STAGES) * (A_TILE_FLOATS + B_TILE_FLOATS);
            load_a_tile_async(As, A, lda, M, row0, k_begin + next * BK, k_end, vec_a);
            load_b_tile_async(As + A_TILE_FLOATS, B, ldb, N, col0, k_begin + next * BK, k_end, vec_b);
        }
        cp_async_commit();
        const float* As = smem + (t % STAGES) * (A_TILE_FLOATS + B_TILE_FLOATS);
        warp_tile_mma(As, As + A_TILE_FLOATS, p, acc);
        if (FOLD_AFTER(t, BK)) fold_sums(total, acc);
    }
    cp_async_wait<0>();
    fold_sums(total, acc);

#if SPLIT
    float* partial = workspace + (size_t)blockIdx.z * M * N;
    warp_tile_store(partial, N, M, N, row0, col0, p, total, 1.0f, 0.0f, (N % 4 == 0) && aligned16(workspace),
                    nullptr);
#else
    const bool vec_c = (ldc % 4 == 0) && aligned16(C);
    warp_tile_store(C, ldc, M, N, row0, col0, p, total, alpha, beta, vec_c, bias);
#endif
}
