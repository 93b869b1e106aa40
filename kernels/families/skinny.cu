// Rung 10: small-M GEMM ("skinny": a few rows of A against a large B, e.g. 16 x 4096 x 4096),
// where reading B once from DRAM is the floor and the tiled families' block-wide pipelines stall.
// Each warp streams its own batches of UNROLL rows of a 128-column slice of B (plus the matching
// TM x UNROLL corner of A) into a private STAGES-deep cp.async ring, so the bytes in flight live
// in shared memory, not registers, and no block barrier sits in the main loop. Each lane keeps
// the TM x 4 outputs of its four columns. The WK warps of a block take turns over the block's K
// range and meet once, at the end; SPLITK (`splits`) spreads K over blocks (blockIdx.z) through the
// workspace and the reduction kernel. Each warp sums its products in two levels
// (blocked_sum.cuh): a chunk of SUM_CHUNK of its k values from zero, then into its running total.
#define BN 128
#define NT (32 * WK)
#define STAGE_FLOATS (UNROLL * BN + TM * UNROLL)  // B batch [UNROLL][BN], then A corner [TM][UNROLL]
#include "common.cuh"

#include "cp_async.cuh"
#include "blocked_sum.cuh"

// Batch of rows k .. k+UNROLL into one ring slot; zeros past the slice, the matrix or its rows.
// A transposed operand (TA, TB) has no contiguous run along the slot's rows: it takes the
// element-wise copies.
__device__ __forceinline__ void stage_batch(float* slot, const float* __restrict__ A, int lda,
                                            const float* __restrict__ B, int ldb, int M, int N, int row0,
                                            int col, int k, int k_end, bool vec_a, bool vec_b) {
    const int lane = threadIdx.x % 32;
    float* Bs = slot + lane * 4;
    const bool full_rows = k + UNROLL <= k_end;
    if (!TB && vec_b && full_rows && col + 4 <= N) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) cp_async16(Bs + u * BN, B + (size_t)(k + u) * ldb + col);
    } else {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const bool in = k + u < k_end && col + j < N;
#if TB
                cp_async4(Bs + u * BN + j, in ? &B_AT(k + u, col + j) : B, in);
#else
                cp_async4(Bs + u * BN + j, in ? B + (size_t)(k + u) * ldb + col + j : B, in);
#endif
            }
    }
    constexpr int A_CHUNKS = TM * UNROLL / 4;
    float* As = slot + UNROLL * BN;
#pragma unroll
    for (int c = lane; c < A_CHUNKS; c += 32) {
        const int i = c / (UNROLL / 4), u = (c % (UNROLL / 4)) * 4;
#if TA
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const bool in = row0 + i < M && k + u + q < k_end;
            cp_async4(As + i * UNROLL + u + q, in ? &A_AT(row0 + i, k + u + q) : A, in);
        }
#else
        const float* src = A + (size_t)(row0 + i) * lda + k + u;
        if (vec_a && full_rows && row0 + i < M) {
            cp_async16(As + i * UNROLL + u, src);
        } else {
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const bool in = row0 + i < M && k + u + q < k_end;
                cp_async4(As + i * UNROLL + u + q, in ? src + q : A, in);
            }
        }
#endif
    }
}

// acc[i][j] += A[row0+i][k+u] * B[k+u][col+j] over the batch; A comes as broadcast 16-byte reads.
__device__ __forceinline__ void multiply_batch(float (&acc)[TM][4], const float* slot) {
    const int lane = threadIdx.x % 32;
    const float* As = slot + UNROLL * BN;
#pragma unroll
    for (int u = 0; u < UNROLL; u += 4) {
        float a[TM][4];
#pragma unroll
        for (int i = 0; i < TM; ++i) *reinterpret_cast<float4*>(a[i]) = *reinterpret_cast<const float4*>(As + i * UNROLL + u);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const float4 b = *reinterpret_cast<const float4*>(slot + (u + q) * BN + lane * 4);
#pragma unroll
            for (int i = 0; i < TM; ++i) {
                acc[i][0] += a[i][q] * b.x;
                acc[i][1] += a[i][q] * b.y;
                acc[i][2] += a[i][q] * b.z;
                acc[i][3] += a[i][q] * b.w;
            }
        }
    }
}

// One output: into C (alpha, beta) or, with split-K, into this slice's plane of the workspace.
__device__ __forceinline__ void store_out(float* __restrict__ C, int ldc, float* __restrict__ workspace, int M,
                                          int N, int row, int col, float v, float alpha, float beta,
                                          const float* __restrict__ bias) {
    if (row >= M || col >= N) return;
#if SPLIT
    workspace[(size_t)blockIdx.z * M * N + (size_t)row * N + col] = v;
#else
    float* c = C + (size_t)row * ldc + col;
    *c = epilogue(v, alpha, beta, c, bias, col);
#endif
}

extern "C" __global__ void __launch_bounds__(NT) gemm(GEMM_ARGS) {
    extern __shared__ __align__(16) float smem[];
    SELECT_BATCH_ENTRY();
    // The M tiles of one column slice are neighbours in launch order, so they share B in L2.
    const int tiles_m = DIV_UP(M, TM);
    const int row0 = (blockIdx.x % tiles_m) * TM, col0 = (blockIdx.x / tiles_m) * BN;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int col = col0 + lane * 4;
    const bool vec_a = (lda % 4 == 0) && aligned16(A);
    const bool vec_b = (ldb % 4 == 0) && aligned16(B);
    // Each split takes whole batches, so a batch never straddles two splits.
    const int k_chunk = DIV_UP(DIV_UP(K, SLICES), UNROLL) * UNROLL;
    const int k_begin = SLICE * k_chunk;
    const int k_end = min(K, k_begin + k_chunk);
    // This warp's batches: warp, warp + WK, warp + 2*WK, ... of the slice.
    const int batches = k_end > k_begin ? DIV_UP(k_end - k_begin, UNROLL) : 0;
    const int mine = batches > warp ? DIV_UP(batches - warp, WK) : 0;
    float* ring = smem + warp * STAGES * STAGE_FLOATS;
    auto k_of = [&](int t) { return k_begin + (warp + t * WK) * UNROLL; };

    float acc[TM][4] = {}, total[TM][4] = {};
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < mine) stage_batch(ring + s * STAGE_FLOATS, A, lda, B, ldb, M, N, row0, col, k_of(s), k_end, vec_a, vec_b);
        cp_async_commit();
    }
    for (int t = 0; t < mine; ++t) {
        cp_async_wait<STAGES - 2>();
        __syncwarp();  // batch t visible to the whole warp; everyone is done with the slot refilled below
        const int next = t + STAGES - 1;
        if (next < mine)
            stage_batch(ring + (next % STAGES) * STAGE_FLOATS, A, lda, B, ldb, M, N, row0, col, k_of(next), k_end,
                        vec_a, vec_b);
        cp_async_commit();
        multiply_batch(acc, ring + (t % STAGES) * STAGE_FLOATS);
        if (FOLD_AFTER(t, UNROLL)) fold_sums(total, acc);
    }
    fold_sums(total, acc);
    cp_async_wait<0>();

#if WK > 1
    // The warps' partial tiles, summed in a fixed order (deterministic) by the whole block; the
    // rings are free now, so the partials reuse their memory.
    __syncthreads();
    float* partial = smem;  // [WK][TM][BN]
#pragma unroll
    for (int i = 0; i < TM; ++i)
        *reinterpret_cast<float4*>(partial + (warp * TM + i) * BN + lane * 4) = *reinterpret_cast<const float4*>(total[i]);
    __syncthreads();
    for (int idx = threadIdx.x; idx < TM * BN; idx += NT) {
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < WK; ++w) s += partial[w * TM * BN + idx];
        store_out(C, ldc, workspace, M, N, row0 + idx / BN, col0 + idx % BN, s, alpha, beta, bias);
    }
#else
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) store_out(C, ldc, workspace, M, N, row0 + i, col + j, total[i][j], alpha, beta, bias);
#endif
}
