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

// ---- synchronous loads (global -> registers -> shared) --------------------------------------
// Fast path: the whole tile lies inside the matrix and rows are 16-byte aligned, so each thread
// moves float4s. Otherwise every element is predicated (zero outside the matrix).
__device__ __forceinline__ void load_a_tile(float* As, const float* A, int lda, int M, int K,
                                            int row0, int k0, bool vec_a) {
    const int tid = threadIdx.x;
    if (vec_a && row0 + BM <= M && k0 + BK <= K) {
#pragma unroll
        for (int it = 0; it < BM * BK / 4 / NT; ++it) {
            const int idx = tid + it * NT;
            const int r = idx / (BK / 4), c = (idx % (BK / 4)) * 4;
            const float4 v = *reinterpret_cast<const float4*>(A + (size_t)(row0 + r) * lda + k0 + c);
            As[(c + 0) * LDA_S + r] = v.x;
            As[(c + 1) * LDA_S + r] = v.y;
            As[(c + 2) * LDA_S + r] = v.z;
            As[(c + 3) * LDA_S + r] = v.w;
        }
    } else {
        for (int i = tid; i < BM * BK; i += NT) {
            const int r = i / BK, c = i % BK;
            As[c * LDA_S + r] = (row0 + r < M && k0 + c < K) ? A[(size_t)(row0 + r) * lda + k0 + c] : 0.0f;
        }
    }
}

__device__ __forceinline__ void load_b_tile(float* Bs, const float* B, int ldb, int N, int K,
                                            int col0, int k0, bool vec_b) {
    const int tid = threadIdx.x;
    if (vec_b && col0 + BN <= N && k0 + BK <= K) {
#pragma unroll
        for (int it = 0; it < BK * BN / 4 / NT; ++it) {
            const int idx = tid + it * NT;
            const int r = idx / (BN / 4), c = (idx % (BN / 4)) * 4;
            *reinterpret_cast<float4*>(Bs + r * LDB_S + c) =
                *reinterpret_cast<const float4*>(B + (size_t)(k0 + r) * ldb + col0 + c);
        }
    } else {
        for (int i = tid; i < BK * BN; i += NT) {
            const int r = i / BN, c = i % BN;
            Bs[r * LDB_S + c] = (k0 + r < K && col0 + c < N) ? B[(size_t)(k0 + r) * ldb + col0 + c] : 0.0f;
        }
    }
}

// ---- asynchronous loads (cp.async, sm_80+) ---------------------------------------------------
#include "cp_async.cuh"

// A is transposed on the way in, one 4-byte copy per element (a 16-byte copy cannot scatter).
__device__ __forceinline__ void load_a_tile_async(float* As, const float* A, int lda, int M, int K,
                                                  int row0, int k0, int k_end) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int it = 0; it < DIV_UP(BM * BK, NT); ++it) {
        const int i = tid + it * NT;
        if (BM * BK % NT == 0 || i < BM * BK) {
            const int r = i / BK, c = i % BK;
            const bool in = row0 + r < M && k0 + c < k_end;
            cp_async4(As + c * LDA_S + r, in ? A + (size_t)(row0 + r) * lda + k0 + c : A, in);
        }
    }
}

__device__ __forceinline__ void load_b_tile_async(float* Bs, const float* B, int ldb, int N, int K,
                                                  int col0, int k0, int k_end, bool vec_b) {
    const int tid = threadIdx.x;
    if (vec_b && col0 + BN <= N && k0 + BK <= k_end) {
#pragma unroll
        for (int it = 0; it < BK * BN / 4 / NT; ++it) {
            const int idx = tid + it * NT;
            const int r = idx / (BN / 4), c = (idx % (BN / 4)) * 4;
            cp_async16(Bs + r * LDB_S + c, B + (size_t)(k0 + r) * ldb + col0 + c);
        }
    } else {
        for (int i = tid; i < BK * BN; i += NT) {
            const int r = i / BN, c = i % BN;
            const bool in = k0 + r < k_end && col0 + c < N;
            cp_async4(Bs + r * LDB_S + c, in ? B + (size_t)(k0 + r) * ldb + col0 + c : B, in);
        }
    }
}

// ---- epilogue ---------------------------------------------------------------------------------
// Four consecutive outputs of one row; float4 when the row is aligned and inside the matrix.
__device__ __forceinline__ void store4(float* C, int ldc, int M, int N, int row, int col,
                                       const float* v, float alpha, float beta, bool vec_c) {
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
        *reinterpret_cast<float4*>(c) = out;
    } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
            if (col + j < N) c[j] = epilogue(v[j], alpha, beta, c + j);
    }
}
