// Tile movement and epilogue shared by the vectorized, warptiled and pipelined families.
// Needs BM, BN, BK, PADA, PADB and NT (threads per block) defined before it.
// Shared-memory layout: A tile transposed, As[BK][BM + PADA]; B tile As-is, Bs[BK][BN + PADB].
// PADA/PADB shift successive rows across banks so the transposed stores of A do not collide.
#ifndef PADB
#define PADB 0
#endif
#define LDA_S (BM + PADA)
#define LDB_S (BN + PADB)
#define A_TILE_FLOATS (BK * LDA_S)
#define B_TILE_FLOATS (BK * LDB_S)

// Two ways a tile moves from a stored matrix G (row-major, leading dimension ld) into shared
// memory S (row stride LD_S), whatever the layout: the ROWS x COLS block at (r0, c0) of G,
// elements past (rlim, clim) read as zero, is
//   copied:     S[r][c] = G[r0 + r][c0 + c]   (the stored rows are the shared rows: float4 moves)
//   transposed: S[c][r] = G[r0 + r][c0 + c]   (each element scattered to its own shared row)
// A is kept as As[BK][BM] and B as Bs[BK][BN], so which of the two each operand takes depends on
// its layout: row-major A (k contiguous) and a transposed B (k contiguous) are transposed on the
// way in. (Addresses are formed from the matrix's base as the layout-free code formed them, so
// the row-major layouts compile as they did.)

// ---- synchronous loads (global -> registers -> shared) --------------------------------------
// Fast path: the whole tile lies inside the matrix and rows are 16-byte aligned, so each thread
// moves float4s. Otherwise every element is predicated (zero outside the matrix).
template <int ROWS, int COLS, int LD_S>
__device__ __forceinline__ void copy_tile(float* S, const float* G, int ld, int r0, int c0, int rlim, int clim,
                                          bool vec) {
    const int tid = threadIdx.x;
    if (vec && r0 + ROWS <= rlim && c0 + COLS <= clim) {
#pragma unroll
        for (int it = 0; it < DIV_UP(ROWS * COLS / 4, NT); ++it) {
            const int idx = tid + it * NT;
            if (ROWS * COLS / 4 % NT != 0 && idx >= ROWS * COLS / 4) break;  // fewer chunks than threads
            const int r = idx / (COLS / 4), c = (idx % (COLS / 4)) * 4;
            *reinterpret_cast<float4*>(S + r * LD_S + c) =
                *reinterpret_cast<const float4*>(G + (size_t)(r0 + r) * ld + c0 + c);
        }
    } else {
        for (int i = tid; i < ROWS * COLS; i += NT) {
            const int r = i / COLS, c = i % COLS;
            S[r * LD_S + c] = (r0 + r < rlim && c0 + c < clim) ? G[(size_t)(r0 + r) * ld + c0 + c] : 0.0f;
        }
    }
}

template <int ROWS, int COLS, int LD_S>
__device__ __forceinline__ void transpose_tile(float* S, const float* G, int ld, int r0, int c0, int rlim,
                                               int clim, bool vec) {
    const int tid = threadIdx.x;
    if (vec && r0 + ROWS <= rlim && c0 + COLS <= clim) {
#pragma unroll
        for (int it = 0; it < DIV_UP(ROWS * COLS / 4, NT); ++it) {
            const int idx = tid + it * NT;
            if (ROWS * COLS / 4 % NT != 0 && idx >= ROWS * COLS / 4) break;  // fewer chunks than threads
            const int r = idx / (COLS / 4), c = (idx % (COLS / 4)) * 4;
            const float4 v = *reinterpret_cast<const float4*>(G + (size_t)(r0 + r) * ld + c0 + c);
            S[(c + 0) * LD_S + r] = v.x;
            S[(c + 1) * LD_S + r] = v.y;
            S[(c + 2) * LD_S + r] = v.z;
            S[(c + 3) * LD_S + r] = v.w;
        }
    } else {
        for (int i = tid; i < ROWS * COLS; i += NT) {
            const int r = i / COLS, c = i % COLS;
            S[c * LD_S + r] = (r0 + r < rlim && c0 + c < clim) ? G[(size_t)(r0 + r) * ld + c0 + c] : 0.0f;
        }
    }
}

// As[BK][BM] <- A's rows row0.., depths k0.. (k < K).
__device__ __forceinline__ void load_a_tile(float* As, const float* A, int lda, int M, int K,
                                            int row0, int k0, bool vec_a) {
#if TA
    copy_tile<BK, BM, LDA_S>(As, A, lda, k0, row0, K, M, vec_a);
#else
    transpose_tile<BM, BK, LDA_S>(As, A, lda, row0, k0, M, K, vec_a);
#endif
}

// Bs[BK][BN] <- B's depths k0.. (k < K), columns col0...
__device__ __forceinline__ void load_b_tile(float* Bs, const float* B, int ldb, int N, int K,
                                            int col0, int k0, bool vec_b) {
#if TB
    transpose_tile<BN, BK, LDB_S>(Bs, B, ldb, col0, k0, N, K, vec_b);
#else
    copy_tile<BK, BN, LDB_S>(Bs, B, ldb, k0, col0, K, N, vec_b);
#endif
}

// ---- asynchronous loads (cp.async, sm_80+) ---------------------------------------------------
#include "cp_async.cuh"

// 16-byte copies where the tile is inside the matrix and aligned, else predicated 4-byte copies
// (src-size 0 zero-fills).
template <int ROWS, int COLS, int LD_S>
__device__ __forceinline__ void copy_tile_async(float* S, const float* G, int ld, int r0, int c0, int rlim,
                                                int clim, bool vec) {
    const int tid = threadIdx.x;
    if (vec && c0 + COLS <= clim && r0 + ROWS <= rlim) {
#pragma unroll
        for (int it = 0; it < DIV_UP(ROWS * COLS / 4, NT); ++it) {
            const int idx = tid + it * NT;
            if (ROWS * COLS / 4 % NT != 0 && idx >= ROWS * COLS / 4) break;  // fewer chunks than threads
            const int r = idx / (COLS / 4), c = (idx % (COLS / 4)) * 4;
            cp_async16(S + r * LD_S + c, G + (size_t)(r0 + r) * ld + c0 + c);
        }
    } else {
        for (int i = tid; i < ROWS * COLS; i += NT) {
            const int r = i / COLS, c = i % COLS;
            const bool in = r0 + r < rlim && c0 + c < clim;
            cp_async4(S + r * LD_S + c, in ? G + (size_t)(r0 + r) * ld + c0 + c : G, in);
        }
    }
}

// Transposed on the way in: one 4-byte copy per element (a 16-byte copy cannot scatter).
template <int ROWS, int COLS, int LD_S>
__device__ __forceinline__ void transpose_tile_async(float* S, const float* G, int ld, int r0, int c0, int rlim,
                                                     int clim) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int it = 0; it < DIV_UP(ROWS * COLS, NT); ++it) {
        const int i = tid + it * NT;
        if (ROWS * COLS % NT == 0 || i < ROWS * COLS) {
            const int r = i / COLS, c = i % COLS;
            const bool in = r0 + r < rlim && c0 + c < clim;
            cp_async4(S + c * LD_S + r, in ? G + (size_t)(r0 + r) * ld + c0 + c : G, in);
        }
    }
}

// As[BK][BM] <- A's rows row0.., depths k0.. (k < k_end: a split-K slice ends there).
__device__ __forceinline__ void load_a_tile_async(float* As, const float* A, int lda, int M, int row0, int k0,
                                                  int k_end, bool vec_a) {
#if TA
    copy_tile_async<BK, BM, LDA_S>(As, A, lda, k0, row0, k_end, M, vec_a);
#else
    transpose_tile_async<BM, BK, LDA_S>(As, A, lda, row0, k0, M, k_end);
#endif
}

__device__ __forceinline__ void load_b_tile_async(float* Bs, const float* B, int ldb, int N, int col0, int k0,
                                                  int k_end, bool vec_b) {
#if TB
    transpose_tile_async<BN, BK, LDB_S>(Bs, B, ldb, col0, k0, N, k_end);
#else
    copy_tile_async<BK, BN, LDB_S>(Bs, B, ldb, k0, col0, k_end, N, vec_b);
#endif
}

// ---- epilogue ---------------------------------------------------------------------------------
// Four consecutive outputs of one row; float4 when the row is aligned and inside the matrix.
// In BIAS programs the bias is added along the row: bias[col + j].
__device__ __forceinline__ void store4(float* C, int ldc, int M, int N, int row, int col,
                                       const float* v, float alpha, float beta, bool vec_c,
                                       const float* __restrict__ bias) {
    if (row >= M) return;
    float* c = C + (size_t)row * ldc + col;
    if (vec_c && col + 3 < N) {
        float4 out;
        if (beta == 0.0f) {
            out = make_float4(alpha * v[0], alpha * v[1], alpha * v[2], alpha * v[3]);
        } else {
            const float4 old = *reinterpret_cast<const float4*>(c);
            out = make_float4(alpha * v[0] + beta * old.x, alpha * v[1] + beta * old.y,
                              alpha * v[2] + beta * old.z, alpha * v[3] + beta * old.w);
        }
#if BIAS
        if (bias) {  // null for split-K partials: the reduction adds it
            out.x += bias[col];
            out.y += bias[col + 1];
            out.z += bias[col + 2];
            out.w += bias[col + 3];
        }
#endif
        *reinterpret_cast<float4*>(c) = out;
    } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
            if (col + j < N) c[j] = epilogue(v[j], alpha, beta, c + j, bias, col + j);
    }
}
