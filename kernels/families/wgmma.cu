// Rung 11: Hopper's own path to FP32-accurate tensor-core GEMM (sm_90a).
//
// 3xTF32 as in tf32x3 (x = big + small, big = x rounded to TF32 (10 mantissa bits); a*b summed
// as a_small*b_big + a_big*b_small + a_big*b_big), issued as warpgroup MMAs (wgmma.mma_async)
// fed by the bulk tensor copy engine (TMA) through an mbarrier ring, with one producer warpgroup
// and WGS consumer warpgroups (warp specialization, setmaxnreg).
//
// TF32 wgmma reads its shared-memory operand only K-major. Row-major A is K-major; row-major B is
// not. So the kernel computes C^T = B^T A^T: the wgmma "A" operand (64 rows = 64 columns of C)
// comes from registers, loaded from the B tile and split into big/small there, and the wgmma "B"
// operand (BM rows of C) is the A tile, read from shared memory through descriptors. A's small
// part must therefore exist in shared memory: a pre-pass (gemm_pack) writes A's big and small
// parts to the workspace as [2][M][Kp] (Kp = K rounded up to 4, zero-padded), which also makes
// them 16-byte aligned for TMA whatever A's pointer and lda (with ASPLIT = 1 and A aligned, TMA
// reads A as it is and the producer warpgroup's idle warps split it in shared memory instead: one
// pass over A). B is read by TMA where it and ldb are 16-byte aligned, else
// from an aligned copy the pre-pass makes.
//
// Layouts: a transposed A (TA) is not K-major, so the pre-pass always packs it (ASPLIT does not
// apply). B's tile is read into registers element by element, so it comes in either orientation:
// row-major B as BN/32 boxes of [BK][32] (N contiguous), a transposed B (TB; e.g. x @ W.T) as
// BK/32 boxes of [BN][32] (K contiguous). Batched problems read batch entry b through the maps'
// third coordinate (b, or 2b + part for the packed A).
//
// The tensor core truncates when it accumulates, so each consumer sums FLUSH k-steps (8 deep,
// three MMAs each) from zero in the tensor core and adds them to FP32 accumulators with a
// round-to-nearest FADD (the same cure as tf32x3's KGROUP). Within a flush the cross-term MMAs
// go first and the big products last, so that only the last FLUSH MMAs are cut at the big sum's
// scale (docs/kernels.md, "A model of the tensor core's accumulation").
#define BN (64 * MW * WGS)
#define NT (128 * (WGS + 1))
#define KATOMS (BK / 32)                       // 32-deep (128-byte) swizzle atoms per stage
#define A_ATOM_BYTES (BM * 128)                // BM rows x 32 floats, TMA 128-byte swizzle
#define A_STAGE_BYTES (2 * KATOMS * A_ATOM_BYTES)  // big atoms, then small atoms
#define B_BOX_BYTES (BK * 128)                 // BK rows x 32 floats of B, 128-byte swizzle
#define BT_BOX_BYTES (BN * 128)                // TB: BN rows x 32 floats (k) of B
#define B_STAGE_BYTES ((BN / 32) * B_BOX_BYTES)
#define STAGE_BYTES (A_STAGE_BYTES + B_STAGE_BYTES)
#define SPLITTER_WARPS 3                       // the producer warpgroup's warps 1-3 (ASPLIT)
#if WGS == 1
#define CONSUMER_REGS 0                        // 256 threads: the entry cap (255) is already enough
#elif WGS == 2
#define CONSUMER_REGS 232                      // 128 x 40 + 256 x 232 <= 64K registers
#else
#define CONSUMER_REGS 152                      // 128 x 40 + 384 x 152 <= 64K registers
#endif
#include "common.cuh"

#include "cp_async.cuh"
#include "wgmma_ops.cuh"

#include "tma_map.cuh"

// Workspace layout (floats), mirrored by wgmma.py: [batch][splits][M][N] split-K partials (when
// SPLIT), then A's big and small parts [batch][2][M][Kp], then B's aligned copy (used only when
// TMA cannot read B in place): [batch][K][Np], or [batch][N][Kp] for a transposed B. Offsets are
// rounded up to 64 floats (256 bytes).
__device__ __forceinline__ long long round64(long long x) { return (x + 63) / 64 * 64; }
__device__ __forceinline__ int padded4(int x) { return (x + 3) & ~3; }
__device__ __forceinline__ long long ws_a_offset(int M, int N, int splits, int batch) {
    return SPLIT ? round64((long long)batch * splits * M * N) : 0;
}
__device__ __forceinline__ long long ws_b_offset(int M, int N, int K, int splits, int batch) {
    return ws_a_offset(M, N, splits, batch) + round64(2ll * batch * M * padded4(K));
}
// TMA reads an operand in place where its address, row stride and batch stride are 16-byte
// multiples (a batch stride of 0, a broadcast operand, it cannot express); kernels/runtime.py
// applies the same rule when it encodes the maps.
__device__ __forceinline__ bool tma_ready(const float* X, int ld, long long stride, int batch) {
    return aligned16(X) && (ld & 3) == 0 && (batch == 1 || (stride != 0 && (stride & 3) == 0));
}
// ASPLIT = 1: where TMA can read A in place, the kernel splits it in shared memory (no pre-pass
// for A); elsewhere the pre-pass packs it as with ASPLIT = 0.
__device__ __forceinline__ bool a_split_in_kernel(const float* A, int lda, long long stride_a, int batch) {
    return ASPLIT && !TA && tma_ready(A, lda, stride_a, batch);
}

// big = x rounded to nearest TF32, so small = x - big (exact) takes either sign: the tensor core's
// truncation of small and the dropped small*small term then err both ways instead of always
// toward zero (with big = x truncated, uniform [0,1) inputs measured 1.85x cuBLAS FP32's error
// even with FLUSH = 1; docs/kernels.md, "Accuracy: FLUSH and round-to-nearest splits").
#include "tf32_big.cuh"

__device__ __forceinline__ void split_rn(float x, float& big, float& small) {
    big = __uint_as_float(tf32_big(x));
    small = x - big;
}

// This thread's share of a grid-stride walk over `rows` rows of `quads` quads each: body(r, q).
// One division per thread at the start, then the stride's quotient and remainder added: a 64-bit
// division per quad made the pre-pass instruction-bound (docs/kernels.md, "wgmma's pre-pass").
// The grid is at most PACK_MAX_BLOCKS x 256 threads (wgmma.py), so ints hold every index.
template <typename Body>
__device__ __forceinline__ void walk_quads(int rows, int quads, Body body) {
    const int step = gridDim.x * blockDim.x, first = blockIdx.x * blockDim.x + threadIdx.x;
    if (first >= (long long)rows * quads) return;  // the grid is sized for the larger operand
    const int dr = step / quads, dq = step % quads;
    int r = first / quads, q = first % quads;
    while (r < rows) {
        body(r, q);
        r += dr, q += dq;
        if (q >= quads) q -= quads, ++r;
    }
}

// The pre-pass, one batch entry per blockIdx.y: A -> [big | small] (zero-padded to Kp), and B ->
// aligned copy where TMA cannot read B in place. Grid-stride walks over quads: four consecutive
// k (or n) per thread, loaded as a float4 where the operand is aligned and stored as float4. A
// transposed A (stored K x M) goes through a 32 x 32 shared tile, so that its reads (along m) and
// its float4 stores (along k) are both coalesced; read and split in one pass, its stores strode
// by Kp and the pre-pass took as long as the GEMM (docs/kernels.md, "The transposed A's pre-pass").
extern "C" __global__ void __launch_bounds__(256) gemm_pack(GEMM_ARGS) {
    follow_previous_grid();
    const int batch = gridDim.y;
    const int Kp = padded4(K);
    const long long quads = (long long)M * (Kp / 4);
    const long long entry = blockIdx.y;
    const float* __restrict__ Ab = A + entry * stride_a;
    const float* __restrict__ Bb = B + entry * stride_b;
    float4* big = reinterpret_cast<float4*>(workspace + ws_a_offset(M, N, splits, batch)) + entry * 2 * quads;
    float4* small = big + quads;
#if TA
    __shared__ float tile[32][33];  // [k][m], padded: both passes are free of bank conflicts
    const int m_tiles = (M + 31) / 32;
    const long long tiles = (long long)m_tiles * ((Kp + 31) / 32);
    for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {  // uniform per block: it syncs
        const int m0 = (int)(t % m_tiles) * 32, k0 = (int)(t / m_tiles) * 32;
        for (int j = threadIdx.x; j < 32 * 32; j += blockDim.x) {
            const int kk = j / 32, mm = j % 32;
            tile[kk][mm] = k0 + kk < K && m0 + mm < M ? Ab[(size_t)(k0 + kk) * lda + m0 + mm] : 0.0f;
        }
        __syncthreads();
        for (int j = threadIdx.x; j < 32 * 8; j += blockDim.x) {
            const int mm = j / 8, qq = j % 8;
            if (m0 + mm < M && k0 + 4 * qq < Kp) {
                float b4[4], s4[4];
#pragma unroll
                for (int u = 0; u < 4; ++u) split_rn(tile[4 * qq + u][mm], b4[u], s4[u]);
                const long long q = (long long)(m0 + mm) * (Kp / 4) + k0 / 4 + qq;
                big[q] = make_float4(b4[0], b4[1], b4[2], b4[3]);
                small[q] = make_float4(s4[0], s4[1], s4[2], s4[3]);
            }
        }
        __syncthreads();
    }
#else
    if (!a_split_in_kernel(A, lda, stride_a, batch)) {
        const bool vec = aligned16(Ab) && (lda & 3) == 0;
        walk_quads(M, Kp / 4, [&](int m, int q) {
            const int k = 4 * q;
            const float* src = Ab + (size_t)m * lda + k;
            float x[4];
            if (vec && k + 4 <= K) {
                const float4 v = *reinterpret_cast<const float4*>(src);
                x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
            } else {
#pragma unroll
                for (int j = 0; j < 4; ++j) x[j] = k + j < K ? src[j] : 0.0f;
            }
            float b4[4], s4[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) split_rn(x[j], b4[j], s4[j]);
            const long long i = (long long)m * (Kp / 4) + q;
            big[i] = make_float4(b4[0], b4[1], b4[2], b4[3]);
            small[i] = make_float4(s4[0], s4[1], s4[2], s4[3]);
        });
    }
#endif
    if (!tma_ready(B, ldb, stride_b, batch)) {
        // the stored matrix's rows (k for row-major B, n for a transposed one), padded to 4
        const int rows = TB ? N : K, cols = TB ? K : N, cols_p = padded4(cols);
        float4* wb = reinterpret_cast<float4*>(workspace + ws_b_offset(M, N, K, splits, batch)) +
                     entry * rows * (cols_p / 4);
        walk_quads(rows, cols_p / 4, [&](int r, int q) {
            const float* src = Bb + (size_t)r * ldb + 4 * q;
            float x[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) x[j] = 4 * q + j < cols ? src[j] : 0.0f;
            wb[(long long)r * (cols_p / 4) + q] = make_float4(x[0], x[1], x[2], x[3]);
        });
    }
}

#include "hopper.cuh"

// ASPLIT's split in shared memory: chunk i (16 bytes) of a stage's A is at a_chunk(stage, i) in the
// big slot; split_in_place writes its big part there and its small part at the same place of the
// small slot (both slots share one swizzled layout, so the byte offset is the element's place).
__device__ __forceinline__ unsigned a_chunk(unsigned stage, int i) {
    return stage + (i / (BM * 8)) * A_ATOM_BYTES + (i % (BM * 8)) * 16;
}
__device__ __forceinline__ void lds4(unsigned at, float (&x)[4]) {
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(x[0]), "=f"(x[1]), "=f"(x[2]), "=f"(x[3]) : "r"(at));
}
__device__ __forceinline__ void split_in_place(unsigned big_at, const float (&x)[4]) {
    float b[4], r[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) split_rn(x[j], b[j], r[j]);
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(big_at), "f"(b[0]), "f"(b[1]), "f"(b[2]), "f"(b[3])
                 : "memory");
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n"
                 ::"r"(big_at + KATOMS * A_ATOM_BYTES), "f"(r[0]), "f"(r[1]), "f"(r[2]), "f"(r[3]) : "memory");
}

extern "C" __global__ void __launch_bounds__(NT, 1)
gemm(GEMM_ARGS, const __grid_constant__ TmaDesc tmA, const __grid_constant__ TmaDesc tmB) {
    follow_previous_grid();
    extern __shared__ unsigned char smem_raw[];
    // Swizzled tiles must sit on 1024-byte boundaries: align the window (1 KiB of slack requested).
    const unsigned raw = smem_addr(smem_raw);
    const unsigned base = (raw + 1023) & ~1023u;
    const unsigned bars = base + STAGES * STAGE_BYTES;  // full[STAGES], empty[STAGES], split_done[STAGES]
#define FULL(s) (bars + 8 * (s))
#define EMPTY(s) (bars + 8 * (STAGES + (s)))
#define SPLIT_DONE(s) (bars + 8 * (2 * STAGES + (s)))  // A split in shared memory (a_raw only)

    const int batch = BATCHED ? gridDim.z / SLICES : 1;
    const int entry = (int)BATCH_ENTRY;
    C += entry * stride_c;
    const int tiles_m = DIV_UP(M, BM), tiles_n = DIV_UP(N, BN);
    int tile_m, tile_n;
    tile_coords(tile_m, tile_n, tiles_m, tiles_n, raster);
    const int m0 = tile_m * BM, n0 = tile_n * BN;
    const int k_tiles_all = DIV_UP(K, BK);
    const int per_split = DIV_UP(k_tiles_all, SLICES);
    const int kt_begin = SLICE * per_split;
    const int k_tiles = max(0, min(k_tiles_all, kt_begin + per_split) - kt_begin);

    if (threadIdx.x == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(FULL(s), 1);
            mbar_init(EMPTY(s), WGS * 4);  // one arrival per consumer warp
#if ASPLIT
            mbar_init(SPLIT_DONE(s), SPLITTER_WARPS);
#endif
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    const int wg = threadIdx.x / 128;
    const bool a_raw = a_split_in_kernel(A, lda, stride_a, batch);
    if (wg == 0) {
        // Producer warpgroup: one thread issues every copy; the rest give their registers away.
#if WGS > 1
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
#endif
        if (threadIdx.x == 0) {
            asm volatile("prefetch.tensormap [%0];\n" ::"l"(&tmA) : "memory");
            asm volatile("prefetch.tensormap [%0];\n" ::"l"(&tmB) : "memory");
            int stage = 0;
            unsigned phase = 0;
            for (int kt = 0; kt < k_tiles; ++kt) {
                mbar_wait(EMPTY(stage), phase ^ 1);  // a fresh barrier's "previous phase" is complete
                mbar_expect_tx(FULL(stage), a_raw ? STAGE_BYTES - A_STAGE_BYTES / 2 : STAGE_BYTES);
                const unsigned st = base + stage * STAGE_BYTES;
                const int k0 = (kt_begin + kt) * BK;
#pragma unroll
                for (int atom = 0; atom < KATOMS; ++atom) {
                    if (a_raw) {  // A as it is, into the big slot; the producer's other warps split it there
                        tma_load_3d(st + atom * A_ATOM_BYTES, &tmA, k0 + 32 * atom, m0, entry, FULL(stage));
                    } else {
                        tma_load_3d(st + atom * A_ATOM_BYTES, &tmA, k0 + 32 * atom, m0, 2 * entry, FULL(stage));
                        tma_load_3d(st + (KATOMS + atom) * A_ATOM_BYTES, &tmA, k0 + 32 * atom, m0, 2 * entry + 1,
                                    FULL(stage));
                    }
                }
#if TB
#pragma unroll
                for (int atom = 0; atom < KATOMS; ++atom)
                    tma_load_3d(st + A_STAGE_BYTES + atom * BT_BOX_BYTES, &tmB, k0 + 32 * atom, n0, entry, FULL(stage));
#else
#pragma unroll
                for (int box = 0; box < BN / 32; ++box)
                    tma_load_3d(st + A_STAGE_BYTES + box * B_BOX_BYTES, &tmB, n0 + 32 * box, k0, entry, FULL(stage));
#endif
                if (++stage == STAGES) {
                    stage = 0;
                    phase ^= 1;
                }
            }
        } else if (a_raw && threadIdx.x >= 32) {
            // The producer's other warps split A in shared memory as each stage lands: big slot <-
            // round-to-nearest TF32 of A, small slot <- the rest. Done by the consumers, it kept
            // the tensor cores idle and tied the consumer warpgroups together at a barrier per
            // stage (docs/kernels.md, "ASPLIT: A split in shared memory").
            int stage = 0;
            unsigned phase = 0;
            for (int kt = 0; kt < k_tiles; ++kt) {
                mbar_wait(FULL(stage), phase);
                const unsigned st = base + stage * STAGE_BYTES;
                // two 16-byte chunks a turn, both loads issued before either is split
                constexpr int CHUNKS = KATOMS * BM * 8, STRIDE = 32 * SPLITTER_WARPS;
                for (int i = threadIdx.x - 32; i < CHUNKS; i += 2 * STRIDE) {
                    const bool second = i + STRIDE < CHUNKS;
                    const unsigned at0 = a_chunk(st, i), at1 = a_chunk(st, second ? i + STRIDE : i);
                    float x0[4], x1[4];
                    lds4(at0, x0);
                    lds4(at1, x1);
                    split_in_place(at0, x0);
                    if (second) split_in_place(at1, x1);
                }
                // Ordinary stores that the tensor cores read next: proxy fence, then the arrival.
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                __syncwarp();
                if (threadIdx.x % 32 == 0) mbar_arrive(SPLIT_DONE(stage));
                if (++stage == STAGES) {
                    stage = 0;
                    phase ^= 1;
                }
            }
        }
        return;
    }
#if WGS > 1
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS));
#endif
    // Consumer warpgroup c owns C columns [n0 + 64*MW*c, +64*MW) as MW wgmma tiles of 64, and
    // all BM rows: each wgmma computes a 64 (columns of C) x BM (rows of C) block of C^T.
    const int c = wg - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    float acc[MW][BM / 2], part[MW][BM / 2];
#pragma unroll
    for (int mw = 0; mw < MW; ++mw)
#pragma unroll
        for (int j = 0; j < BM / 2; ++j) acc[mw][j] = part[mw][j] = 0.0f;

    int stage = 0;
    unsigned phase = 0;
    for (int kt = 0; kt < k_tiles; ++kt) {
        mbar_wait(FULL(stage), phase);
        if (a_raw) mbar_wait(SPLIT_DONE(stage), phase);
        const unsigned st = base + stage * STAGE_BYTES;
#pragma unroll
        for (int atom = 0; atom < KATOMS; ++atom) {
            // Register operand: B^T fragments (m16n8k8 A layout per warp: rows g / g+8, k t / t+4).
            unsigned rb[MW][4][4], rs[MW][4][4];
#pragma unroll
            for (int mw = 0; mw < MW; ++mw)
#pragma unroll
                for (int s = 0; s < 4; ++s)
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const int nl = 64 * (MW * c + mw) + 16 * warp + g + 8 * (i & 1);
                        const int kl = 32 * atom + 8 * s + t + 4 * (i >> 1);
                        float x;
#if TB
                        const unsigned at = sw128(st + A_STAGE_BYTES + (kl / 32) * BT_BOX_BYTES, nl, kl % 32);
#else
                        const unsigned at = sw128(st + A_STAGE_BYTES + (nl / 32) * B_BOX_BYTES, kl, nl % 32);
#endif
                        asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(x) : "r"(at));
                        rb[mw][s][i] = tf32_big(x);
                        rs[mw][s][i] = __float_as_uint(x - __uint_as_float(rb[mw][s][i]));
                    }
            const unsigned long long d_big = kmajor_sw128_desc(st + atom * A_ATOM_BYTES);
            const unsigned long long d_small = kmajor_sw128_desc(st + (KATOMS + atom) * A_ATOM_BYTES);
#pragma unroll
            for (int f = 0; f < 4; f += FLUSH) {
                wgmma_fence();
#pragma unroll
                for (int s = f; s < f + FLUSH; ++s)
#pragma unroll
                    for (int mw = 0; mw < MW; ++mw) {
                        // k-step s is 32 bytes further along the swizzled rows: +2 in 16-byte units.
                        wgmma_tf32<BM>(part[mw], rs[mw][s], d_big + 2 * s, s > f);
                        wgmma_tf32<BM>(part[mw], rb[mw][s], d_small + 2 * s, 1);
                    }
                // The big products last (see the top of this file).
#pragma unroll
                for (int s = f; s < f + FLUSH; ++s)
#pragma unroll
                    for (int mw = 0; mw < MW; ++mw) wgmma_tf32<BM>(part[mw], rb[mw][s], d_big + 2 * s, 1);
                wgmma_commit();
                wgmma_wait_all();
                if (atom == KATOMS - 1 && f + FLUSH == 4) {  // this warp is done with the stage
                    __syncwarp();
                    if (lane == 0) mbar_arrive(EMPTY(stage));
                }
#pragma unroll
                for (int mw = 0; mw < MW; ++mw)
#pragma unroll
                    for (int j = 0; j < BM / 2; ++j) acc[mw][j] += part[mw][j];
            }
        }
        if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
        }
    }

    // Accumulator j of tile mw holds C^T(row 16*warp + g + 8*((j/2)%2), col 8*(j/4) + 2t + j%2).
#pragma unroll
    for (int mw = 0; mw < MW; ++mw) {
        const auto place = [&](int j, int& m, int& n) {
            n = n0 + 64 * (MW * c + mw) + 16 * warp + g + 8 * ((j >> 1) & 1);
            m = m0 + 8 * (j >> 2) + 2 * t + (j & 1);
        };
#if SPLIT
#pragma unroll
        for (int j = 0; j < BM / 2; ++j) {
            int m, n;
            place(j, m, n);
            if (m < M && n < N) workspace[(size_t)blockIdx.z * M * N + (size_t)m * N + n] = acc[mw][j];
        }
#else
        store_fragment<false>(acc[mw], place, M, N, alpha, beta, C, ldc, bias);  // j, j + 1: two rows of C
#endif
    }
#undef FULL
#undef EMPTY
#undef SPLIT_DONE
}
