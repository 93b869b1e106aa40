// Rung 9: error-compensated TF32 tensor cores (3xTF32). Each FP32 operand x is split into
// big = tf32(x) and small = x - big; a*b is summed as a_small*b_big + a_big*b_small + a_big*b_big
// with FP32 accumulation (the a_small*b_small term is below FP32 rounding). Three tensor-core
// MMAs per product still outrun FP32 FFMA by a wide margin, at FP32-level accuracy.
//
// Block tile BM x BN, STAGES-deep cp.async ring of BK-deep slices; warps own WM x WN tiles made of
// mma.m16n8k8 tiles. Tiles keep the stored matrix's orientation (16-byte copies whatever the
// layout), with pads chosen so fragment reads hit 32 distinct banks: k-contiguous tiles have rows
// of BK + 4 (row-major A: As[BM][BK + 4], read with ldmatrix.x4; transposed B: Bs[BN][BK + 4]),
// the others rows of BM + 8 / BN + 8 (transposed A: As[BK][BM + 8]; row-major B: Bs[BK][BN + 8]),
// read one element at a time. A stage holds the larger of the two shapes, so a config needs the
// same shared memory in every layout.
#define NT (32 * (BM / WM) * (BN / WN))
#define MI (WM / 16)
#define NI (WN / 8)
#define MAX2(a, b) ((a) > (b) ? (a) : (b))
#if TA
#define LDA_S (BM + 8)
#else
#define LDA_S (BK + 4)
#endif
#if TB
#define LDB_S (BK + 4)
#else
#define LDB_S (BN + 8)
#endif
#define A_TILE_FLOATS MAX2(BM * (BK + 4), BK * (BM + 8))
#define B_TILE_FLOATS MAX2(BK * (BN + 8), BN * (BK + 4))
#define STAGE_FLOATS (A_TILE_FLOATS + B_TILE_FLOATS)
#include "common.cuh"

#include "cp_async.cuh"

// Copies a ROWS x COLS tile (row-major source, leading dimension ld) into shared memory with row
// stride LD_S, four floats per step: one 16-byte copy where the four lie inside the matrix and
// the source is 16-byte aligned, else four predicated 4-byte copies (zero outside the matrix).
template <int ROWS, int COLS, int LD_S>
__device__ __forceinline__ void load_tile_async(float* S, const float* G, int ld, int rows_left,
                                                int cols_left, bool vec) {
    constexpr int CHUNKS = ROWS * COLS / 4;
    if (vec && rows_left >= ROWS && cols_left >= COLS) {  // interior tile: no per-chunk tests
#pragma unroll
        for (int it = 0; it < DIV_UP(CHUNKS, NT); ++it) {
            const int i = threadIdx.x + it * NT;
            if (CHUNKS % NT == 0 || i < CHUNKS) {
                const int r = i / (COLS / 4), c = (i % (COLS / 4)) * 4;
                cp_async16(S + r * LD_S + c, G + (size_t)r * ld + c);
            }
        }
        return;
    }
#pragma unroll
    for (int it = 0; it < DIV_UP(CHUNKS, NT); ++it) {
        const int i = threadIdx.x + it * NT;
        if (CHUNKS % NT == 0 || i < CHUNKS) {
            const int r = i / (COLS / 4), c = (i % (COLS / 4)) * 4;
            float* dst = S + r * LD_S + c;
            const float* src = G + (size_t)r * ld + c;
            if (vec && r < rows_left && c + 4 <= cols_left) {
                cp_async16(dst, src);
            } else {
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const bool in = r < rows_left && c + j < cols_left;
                    cp_async4(dst + j, in ? src + j : G, in);
                }
            }
        }
    }
}

// big = x rounded to the nearest TF32 (ties away from zero, as cvt.rna: add half a TF32 unit to
// the magnitude bits, then drop the low 13; two integer instructions where cvt.rna compiles to
// four), small = x - big exactly. Rounded, small takes either sign, so the tensor core's
// truncation of small and the dropped small*small term err both ways instead of always toward
// zero (docs/kernels.md, "Round-to-nearest splits (formerly truncated)").
__device__ __forceinline__ unsigned tf32_nearest(float x) {
    return (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
}

__device__ __forceinline__ void split_tf32(float x, unsigned& big, unsigned& small) {
    big = tf32_nearest(x);
    small = __float_as_uint(x - __uint_as_float(big));
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    // Not volatile: a pure function of its registers, so the compiler may interleave
    // independent MMAs to hide their latency.
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// A fragment of one 16-row strip and k-step: (row g, k t), (row g + 8, k t), (row g, k t + 4),
// (row g + 8, k t + 4). Volatile loads: warp_slice reads each fragment twice on purpose (below),
// and a merged read would keep four k-steps of fragments alive in registers.
__device__ __forceinline__ void load_a_fragment(const float* As, int row0, int k, float (&a)[4]) {
    const int lane = threadIdx.x % 32;
#if TA
    const volatile float* p = As + (k + lane % 4) * LDA_S + row0 + lane / 4;
    a[0] = p[0];
    a[1] = p[8];
    a[2] = p[4 * LDA_S];
    a[3] = p[4 * LDA_S + 8];
#else
    // ldmatrix.x4: lanes 0-7 / 8-15 / 16-23 / 24-31 address rows of the four 8x4 FP32 quarters
    // (rows 0-7 | 8-15) x (k 0-3 | 4-7), which land exactly as the m16n8k8 A fragment.
    const float* p = As + (row0 + lane % 16) * LDA_S + k + (lane / 16) * 4;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=f"(a[0]), "=f"(a[1]), "=f"(a[2]), "=f"(a[3])
                 : "r"(smem_addr(p)));
#endif
}

// One BK-deep slice of the warp's WM x WN tile, in groups of KG k-steps (8 deep each).
#define KG KGROUP
// The tensor core accumulates with truncation; fed the running sum for all of K, that bias grows
// with K (rel. error 3e-5 at K=4096, measured). So each (mma tile, group) sums its k-steps from
// zero and joins the running sum in one round-to-nearest FADD. Within a group the cross terms of
// all its k-steps go first and the big*big products last, so the cross terms are not cut at the
// big products' scale (docs/kernels.md, "A model of the tensor core's accumulation"). The A
// fragments are read and rounded again for the big*big pass rather than kept, which measured
// faster (docs/kernels.md, "tf32x3 sums small-first"). B fragments of the group are held for all
// 16-row strips.
__device__ __forceinline__ void warp_slice(const float* As, const float* Bs, int warp_m0, int warp_n0,
                                           float (&acc)[MI][NI][4]) {
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int k0 = 0; k0 < BK; k0 += 8 * KG) {
        unsigned b_big[KG][NI][2], b_small[KG][NI][2];
#pragma unroll
        for (int ks = 0; ks < KG; ++ks)
#pragma unroll
            for (int ni = 0; ni < NI; ++ni) {  // B fragment: (k t, n g) and (k t + 4, n g)
#if TB
                const float* p = Bs + (warp_n0 + ni * 8 + g) * LDB_S + k0 + ks * 8 + t;
                split_tf32(p[0], b_big[ks][ni][0], b_small[ks][ni][0]);
                split_tf32(p[4], b_big[ks][ni][1], b_small[ks][ni][1]);
#else
                const float* p = Bs + (k0 + ks * 8 + t) * LDB_S + warp_n0 + ni * 8 + g;
                split_tf32(p[0], b_big[ks][ni][0], b_small[ks][ni][0]);
                split_tf32(p[4 * LDB_S], b_big[ks][ni][1], b_small[ks][ni][1]);
#endif
            }
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
            const int row0 = warp_m0 + mi * 16;
            // NI independent chains, one MMA of each in turn, so no MMA waits on the previous one.
            float part[NI][4] = {};
#pragma unroll
            for (int ks = 0; ks < KG; ++ks) {  // cross terms
                float a[4];
                unsigned a_big[4], a_small[4];
                load_a_fragment(As, row0, k0 + ks * 8, a);
#pragma unroll
                for (int j = 0; j < 4; ++j) split_tf32(a[j], a_big[j], a_small[j]);
#pragma unroll
                for (int ni = 0; ni < NI; ++ni) mma_tf32(part[ni], a_small, b_big[ks][ni]);
#pragma unroll
                for (int ni = 0; ni < NI; ++ni) mma_tf32(part[ni], a_big, b_small[ks][ni]);
            }
#pragma unroll
            for (int ks = 0; ks < KG; ++ks) {  // big*big
                float a[4];
                unsigned a_big[4];
                load_a_fragment(As, row0, k0 + ks * 8, a);
#pragma unroll
                for (int j = 0; j < 4; ++j) a_big[j] = tf32_nearest(a[j]);
#pragma unroll
                for (int ni = 0; ni < NI; ++ni) mma_tf32(part[ni], a_big, b_big[ks][ni]);
            }
#pragma unroll
            for (int ni = 0; ni < NI; ++ni) {
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[mi][ni][j] += part[ni][j];
            }
        }
    }
}

// Two adjacent outputs of one row (the accumulator pairs of the m16n8 C fragment); in BIAS
// programs the bias is added along the row.
__device__ __forceinline__ void store2(float* C, int ldc, int M, int N, int row, int col, float v0,
                                       float v1, float alpha, float beta, bool vec_c,
                                       const float* __restrict__ bias) {
    if (row >= M) return;
    float* c = C + (size_t)row * ldc + col;
    if (vec_c && col + 1 < N) {
        float2 out = make_float2(alpha * v0, alpha * v1);
        if (beta != 0.0f) {
            const float2 old = *reinterpret_cast<const float2*>(c);
            out.x += beta * old.x;
            out.y += beta * old.y;
        }
#if BIAS
        if (bias) {  // null for split-K partials: the reduction adds it
            out.x += bias[col];
            out.y += bias[col + 1];
        }
#endif
        *reinterpret_cast<float2*>(c) = out;
    } else {
        if (col < N) c[0] = epilogue(v0, alpha, beta, c, bias, col);
        if (col + 1 < N) c[1] = epilogue(v1, alpha, beta, c + 1, bias, col + 1);
    }
}

extern "C" __global__ void __launch_bounds__(NT) gemm(GEMM_ARGS) {
    extern __shared__ __align__(16) float smem[];
    SELECT_BATCH_ENTRY();
    int tile_m, tile_n;
    tile_coords(tile_m, tile_n, DIV_UP(M, BM), DIV_UP(N, BN), raster);
    const int row0 = tile_m * BM, col0 = tile_n * BN;
    const bool vec_a = (lda % 4 == 0) && aligned16(A);
    const bool vec_b = (ldb % 4 == 0) && aligned16(B);
    // Each split takes a whole number of BK slices.
    const int k_chunk = DIV_UP(DIV_UP(K, SLICES), BK) * BK;
    const int k_begin = SLICE * k_chunk;
    const int k_end = min(K, k_begin + k_chunk);
    const int ktiles = k_begin < k_end ? DIV_UP(k_end - k_begin, BK) : 0;
    const int warp = threadIdx.x / 32;
    const int warp_m0 = (warp / (BN / WN)) * WM, warp_n0 = (warp % (BN / WN)) * WN;
    float acc[MI][NI][4] = {};

    auto load_stage = [&](int stage, int tile) {
        float* As = smem + stage * STAGE_FLOATS;
        const int k0 = k_begin + tile * BK;
#if TA
        load_tile_async<BK, BM, LDA_S>(As, A + (size_t)k0 * lda + row0, lda, k_end - k0, M - row0, vec_a);
#else
        load_tile_async<BM, BK, LDA_S>(As, A + (size_t)row0 * lda + k0, lda, M - row0, k_end - k0, vec_a);
#endif
#if TB
        load_tile_async<BN, BK, LDB_S>(As + A_TILE_FLOATS, B + (size_t)col0 * ldb + k0, ldb, N - col0,
                                       k_end - k0, vec_b);
#else
        load_tile_async<BK, BN, LDB_S>(As + A_TILE_FLOATS, B + (size_t)k0 * ldb + col0, ldb, k_end - k0,
                                       N - col0, vec_b);
#endif
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < ktiles) load_stage(s, s);
        cp_async_commit();
    }
    for (int t = 0; t < ktiles; ++t) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();  // slice t visible to all; everyone is done with the stage refilled below
        if (t + STAGES - 1 < ktiles) load_stage((t + STAGES - 1) % STAGES, t + STAGES - 1);
        cp_async_commit();
        const float* As = smem + (t % STAGES) * STAGE_FLOATS;
        warp_slice(As, As + A_TILE_FLOATS, warp_m0, warp_n0, acc);
    }
    cp_async_wait<0>();

    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t2 = (lane % 4) * 2;
#if SPLIT
    float* out = workspace + (size_t)blockIdx.z * M * N;
    const int ld_out = N;
    const float a_out = 1.0f, b_out = 0.0f;
    const float* bias_out = nullptr;
    const bool vec_out = (N % 2 == 0);
#else
    float* out = C;
    const int ld_out = ldc;
    const float a_out = alpha, b_out = beta;
    const float* bias_out = bias;
    const bool vec_out = (ldc % 2 == 0) && ((reinterpret_cast<unsigned long long>(C) & 7ull) == 0);
#endif
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
            const int row = row0 + warp_m0 + mi * 16 + g, col = col0 + warp_n0 + ni * 8 + t2;
            store2(out, ld_out, M, N, row, col, acc[mi][ni][0], acc[mi][ni][1], a_out, b_out, vec_out, bias_out);
            store2(out, ld_out, M, N, row + 8, col, acc[mi][ni][2], acc[mi][ni][3], a_out, b_out, vec_out,
                   bias_out);
        }
}
