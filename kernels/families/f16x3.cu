// Rung 12: FP32-accurate GEMM from half-precision tensor cores (sm_90a).
//
// Each FP32 operand row (a row of A, a column of B) is scaled by a power of two so that its
// largest magnitude lands in [2^14, 2^15), then split as x = hi + lo * 2^-11 with hi = FP16(x)
// and lo = FP16((x - hi) * 2^11): 22 significant bits, FP16's range reused for the low part
// (after Ootomo & Yokota's split). a*b is summed as hi*hi + (hi*lo + lo*hi) * 2^-11; the dropped
// lo*lo term is below 2^-22 of the product. The hi*hi products go to a tensor-core partial that
// is flushed into FP32 registers every FLUSH k-steps with a round-to-nearest add (the tensor
// core truncates when it accumulates, as in wgmma); the correction terms, 2^11 smaller once
// scaled back, have an accumulator of their own that runs over the whole of K (the TF32 path
// sums as wgmma does instead: consume, below).
//
// FP16 cannot hold a row whose elements span more than RANGE_LIMIT binades (the smallest would
// lose bits of their low part). Where any row of A or column of B does, or holds an Inf or NaN,
// the same kernel runs 3xTF32 instead (TF32 keeps FP32's exponent range): a decision made on the
// device for each batch entry (in gemm_pack), so the host never waits and no answer is silently
// wrong (docs/kernels.md, "The range check and the TF32 path").
//
// Passes: gemm_scale (each operand row's largest magnitude, and whether its rows fit FP16),
// gemm_pack (the path; both operands split, K-major, into the workspace: [2][rows][Kp] FP16
// hi/lo parts, or TF32 big/small parts as FP32), gemm (TMA ring of both operands' parts, one
// producer warpgroup and WGS consumer warpgroups issuing wgmma with both operands read from
// shared memory; the split-K reduction as in every family).
#define BM (64 * MW * WGS)
#define NT (128 * (WGS + 1))
#define A_ATOM_BYTES (BM * 128)                // BM rows x 128 bytes (64 FP16 or 32 FP32 of K)
#define B_ATOM_BYTES (BN * 128)
#define STAGE_BYTES (2 * ATOMS * (A_ATOM_BYTES + B_ATOM_BYTES))  // A hi, A lo, B hi, B lo
#define RANGE_LIMIT 28   // binades from a row's largest to its smallest nonzero element
#define TOP_EXPONENT 14  // each row's largest element is scaled into [2^14, 2^15)
#define PACK_K 64        // k per tile of gemm_pack
#if WGS == 1
#define CONSUMER_REGS 0
#elif WGS == 2
#define CONSUMER_REGS 232
#else
#define CONSUMER_REGS 152
#endif
#include "common.cuh"

#include "cp_async.cuh"
#include "tma_map.cuh"
#include "hopper.cuh"
#include "wgmma_ss.cuh"
#include "tf32_big.cuh"

// Workspace, mirrored by f16x3.py (byte offsets, each rounded up to 256): split-K partials
// [batch][splits][M][N] floats; the path flag per batch entry (int); each row's largest |x| as
// FP32 bits, [batch][M] for A and [batch][N] for B; whether each block of 32 rows fits FP16,
// [batch][row blocks of A, then of B] (int); A's parts, then B's: [batch][2][rows][Kp] as FP32
// (Kp = K rounded up to 4) or, on the FP16 path, as FP16 (Kp16 = K rounded up to 8) in the same
// room: the parts are 4 * rows * Kp bytes apart on both paths.
__device__ __forceinline__ long long round256(long long x) { return (x + 255) / 256 * 256; }
__device__ __forceinline__ int padded4(int x) { return (x + 3) & ~3; }
__device__ __forceinline__ int padded8(int x) { return (x + 7) & ~7; }
__device__ __forceinline__ int row_blocks(int M, int N) { return DIV_UP(M, 32) + DIV_UP(N, 32); }

struct Layout {
    long long flags, amax, bmax, fits, apack, bpack;  // byte offsets
};
__device__ __forceinline__ Layout workspace_layout(int M, int N, int K, int splits, int batch) {
    Layout l;
    l.flags = SPLIT ? round256(4ll * batch * splits * M * N) : 0;
    l.amax = l.flags + round256(4ll * batch);
    l.bmax = l.amax + round256(4ll * batch * M);
    l.fits = l.bmax + round256(4ll * batch * N);
    l.apack = l.fits + round256(4ll * batch * row_blocks(M, N));
    l.bpack = l.apack + round256(8ll * batch * M * padded4(K));
    return l;
}
template <typename T>
__device__ __forceinline__ T* at(float* workspace, long long offset) {
    return reinterpret_cast<T*>(reinterpret_cast<char*>(workspace) + offset);
}

// Operand "rows": the rows of A (r = m) and the columns of B (r = n), both indexed by k.
// Element (r, k) of operand `op` (0: A, 1: B) of one batch entry; `along_k`: consecutive k are
// adjacent in memory (row-major A, transposed B), else consecutive r are.
__device__ __forceinline__ float element(const float* X, int ld, bool along_k, int r, int k) {
    return along_k ? X[(size_t)r * ld + k] : X[(size_t)k * ld + r];
}
__device__ __forceinline__ bool along_k(int op) { return op == 0 ? !TA : TB; }

// A row fits FP16 where its elements span at most RANGE_LIMIT binades (zeros aside) and it holds
// no Inf or NaN (the TF32 path carries those as FP32 would). top, bottom: the largest and the
// smallest nonzero |x| as FP32 bits (bottom all ones: no nonzero element).
__device__ __forceinline__ bool row_fits_fp16(unsigned top, unsigned bottom) {
    if (top >= 0x7f800000u) return false;
    if (bottom == 0xffffffffu) return true;
    return ilogbf(__uint_as_float(top)) - ilogbf(__uint_as_float(bottom)) <= RANGE_LIMIT;
}

// Per block of 32 operand rows: each row's largest |x| (its scale) and whether all 32 rows fit
// FP16. Block x covers rows 32x.. of A, then of B. 1024 threads (32 warps), four loads in flight
// each: a pass that only reads must keep many loads in flight to reach DRAM's bandwidth, and
// 256-thread blocks with a loop over rows measured at half of it (docs/kernels.md, "f16x3: the passes").
#define SCALE_THREADS 1024
extern "C" __global__ void __launch_bounds__(SCALE_THREADS, 2) gemm_scale(GEMM_ARGS) {
    follow_previous_grid();
    const int batch = gridDim.z;
    const int entry = blockIdx.z;
    const int a_blocks = DIV_UP(M, 32);
    const int op = blockIdx.x < a_blocks ? 0 : 1;
    const int rows = op == 0 ? M : N;
    const int r0 = 32 * (op == 0 ? blockIdx.x : blockIdx.x - a_blocks);
    const float* X = op == 0 ? A + entry * stride_a : B + entry * stride_b;
    const int ld = op == 0 ? lda : ldb;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __shared__ unsigned top[32][33], bottom[32][33];
    unsigned hi = 0, lo = 0xffffffffu;
    if (along_k(op)) {  // a warp per row, lanes along k
        const int r = r0 + warp;
        if (r < rows) {
            const float* row = X + (size_t)r * ld;
#pragma unroll 4
            for (int k = lane; k < K; k += 32) {
                const unsigned bits = __float_as_uint(row[k]) & 0x7fffffffu;
                hi = max(hi, bits);
                lo = bits ? min(lo, bits) : lo;
            }
        }
        top[warp][lane] = hi, bottom[warp][lane] = lo;  // row warp, its lanes' k
    } else {  // lanes along r (32 adjacent rows: one coalesced load per k), warps along k
        if (r0 + lane < rows) {
            const float* col = X + r0 + lane;
#pragma unroll 4
            for (int k = warp; k < K; k += 32) {
                const unsigned bits = __float_as_uint(col[(size_t)k * ld]) & 0x7fffffffu;
                hi = max(hi, bits);
                lo = bits ? min(lo, bits) : lo;
            }
        }
        top[lane][warp] = hi, bottom[lane][warp] = lo;  // row lane, this warp's k
    }
    __syncthreads();
    if (warp == 0) {  // lane = row r0 + lane: its 32 partial results
        hi = 0, lo = 0xffffffffu;
#pragma unroll 8
        for (int w = 0; w < 32; ++w) hi = max(hi, top[lane][w]), lo = min(lo, bottom[lane][w]);
        const Layout l = workspace_layout(M, N, K, splits, batch);
        const bool real = r0 + lane < rows;
        if (real) at<unsigned>(workspace, op == 0 ? l.amax : l.bmax)[(long long)entry * rows + r0 + lane] = hi;
        const bool fits = __all_sync(0xffffffffu, !real || row_fits_fp16(hi, lo));
        if (lane == 0) at<int>(workspace, l.fits)[(long long)entry * row_blocks(M, N) + blockIdx.x] = fits;
    }
}

// The power of two that scales a row with largest magnitude `top` into [2^14, 2^15).
__device__ __forceinline__ int row_shift(unsigned top) {
    return top == 0 ? 0 : TOP_EXPONENT - ilogbf(__uint_as_float(top));
}
// 2^e as an FP32 number, for e in [-126, 127].
__device__ __forceinline__ float exp2i(int e) { return __int_as_float((e + 127) << 23); }
// Two FP32 numbers rounded to FP16, packed (lo in the low half).
__device__ __forceinline__ unsigned f16x2_bits(float lo, float hi) {
    unsigned d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}
__device__ __forceinline__ float2 f16x2_values(unsigned h) {
    float2 v;
    asm("{\n.reg .f16 l, h;\nmov.b32 {l, h}, %2;\ncvt.f32.f16 %0, l;\ncvt.f32.f16 %1, h;\n}\n"
        : "=f"(v.x), "=f"(v.y) : "r"(h));
    return v;
}
// hi and lo parts of two scaled elements, packed in pairs.
__device__ __forceinline__ void split_pair(float x0, float x1, unsigned& hi, unsigned& lo) {
    hi = f16x2_bits(x0, x1);
    const float2 h = f16x2_values(hi);
    lo = f16x2_bits((x0 - h.x) * 2048.0f, (x1 - h.y) * 2048.0f);
}
__device__ __forceinline__ float tf32_round(float x) { return __uint_as_float(tf32_big(x)); }

// Both operands to their K-major parts, tile by tile (32 rows x 64 k through shared memory, so
// that the reads are coalesced whichever way the operand is stored and the stores run along k).
// blockIdx.y: 0 for A, 1 for B; blockIdx.z: the batch entry. The pass is bound by instruction
// issue, not DRAM, unless each element costs few instructions: whole tiles load without bounds
// checks from one pointer per thread, and each row's scale is two exact multiplies by powers of
// two worked out once per tile (docs/kernels.md, "f16x3: the passes").
extern "C" __global__ void __launch_bounds__(256) gemm_pack(GEMM_ARGS) {
    follow_previous_grid();
    const int batch = gridDim.z;
    const long long entry = blockIdx.z;
    const int op = blockIdx.y;
    const Layout l = workspace_layout(M, N, K, splits, batch);
    // The path: TF32 where any block of rows of A or B does not fit FP16. Every block works it out
    // from gemm_scale's words (one per 32 rows, a load or so per thread) rather than a launch of
    // its own deciding it first; one block writes it down for gemm.
    const int blocks = row_blocks(M, N);
    const int* fits = at<int>(workspace, l.fits) + entry * blocks;
    bool misfit = false;
    for (int i = threadIdx.x; i < blocks; i += blockDim.x) misfit |= !fits[i];
    const bool tf32 = __syncthreads_or(misfit);
    if (blockIdx.x == 0 && op == 0 && threadIdx.x == 0) at<int>(workspace, l.flags)[entry] = tf32;
    const int rows = op == 0 ? M : N;
    const float* X = op == 0 ? A + entry * stride_a : B + entry * stride_b;
    const int ld = op == 0 ? lda : ldb;
    const bool ak = along_k(op);
    const unsigned* tops = at<unsigned>(workspace, op == 0 ? l.amax : l.bmax) + entry * rows;
    const int Kp = tf32 ? padded4(K) : padded8(K);
    // Parts are 4 * rows * padded4(K) bytes apart on either path (the FP16 parts use about half
    // of that), so that batch entries on different paths do not overlap.
    const long long part = 4ll * rows * padded4(K);
    char* base = reinterpret_cast<char*>(workspace) + (op == 0 ? l.apack : l.bpack) + entry * 2 * part;
    // [k][r], padded: stores free of bank conflicts, reads 2-way at worst. 64 k a tile: eight
    // loads in flight per thread, and each row's stores fill whole 128-byte lines on the FP16 path.
    __shared__ float tile[PACK_K][33];
    // Each tile row's scale 2^shift as two factors (shift spans -113..163, past FP32's exponents;
    // on the FP16 path both products are exact: docs/kernels.md, "f16x3: the passes").
    __shared__ float factor[2][32];
    // Thread t's element i of a tile: along k, row t/64 + 4i at k t%64; across, row t%32 at
    // k t/32 + 8i. The same (kk, rr) as j = t + 256i below.
    const int t = threadIdx.x;
    const int r_tiles = DIV_UP(rows, 32);
    const int tiles = r_tiles * DIV_UP(Kp, PACK_K);
    for (int tl = blockIdx.x; tl < tiles; tl += gridDim.x) {  // uniform per block: it syncs
        const int r0 = (tl % r_tiles) * 32, k0 = (tl / r_tiles) * PACK_K;
        if (!tf32 && t < 32) {
            const int shift = row_shift(tops[min(r0 + t, rows - 1)]);
            factor[0][t] = exp2i(shift / 2);
            factor[1][t] = exp2i(shift - shift / 2);
        }
        if (r0 + 32 <= rows && k0 + PACK_K <= K) {  // a whole tile
            const float* src = ak ? X + (size_t)(r0 + t / PACK_K) * ld + k0 + t % PACK_K
                                  : X + (size_t)(k0 + t / 32) * ld + r0 + t % 32;
            const size_t step = (size_t)(ak ? 256 / PACK_K : 256 / 32) * ld;
#pragma unroll
            for (int i = 0; i < 32 * PACK_K / 256; ++i) {
                const int j = t + 256 * i;
                const int kk = ak ? j % PACK_K : j / 32, rr = ak ? j / PACK_K : j % 32;
                tile[kk][rr] = src[i * step];
            }
        } else {
#pragma unroll
            for (int j = t; j < 32 * PACK_K; j += 256) {
                const int kk = ak ? j % PACK_K : j / 32, rr = ak ? j / PACK_K : j % 32;
                tile[kk][rr] = k0 + kk < K && r0 + rr < rows ? element(X, ld, ak, r0 + rr, k0 + kk) : 0.0f;
            }
        }
        __syncthreads();
#pragma unroll
        for (int j = t; j < 32 * PACK_K / 4; j += 256) {
            const int rr = j / (PACK_K / 4), q = j % (PACK_K / 4), r = r0 + rr, k = k0 + 4 * q;
            if (r >= rows || k >= Kp) continue;
            const long long idx = (long long)r * Kp + k;
            if (tf32) {
                float big[4], small[4];
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const float x = tile[4 * q + u][rr];
                    big[u] = tf32_round(x);
                    // rounded to TF32 here, or the tensor core would truncate it: an error that
                    // goes one way, and twice as large
                    small[u] = tf32_round(x - big[u]);
                }
                reinterpret_cast<float4*>(base)[idx / 4] = make_float4(big[0], big[1], big[2], big[3]);
                reinterpret_cast<float4*>(base + part)[idx / 4] = make_float4(small[0], small[1], small[2], small[3]);
            } else {
                const float f0 = factor[0][rr], f1 = factor[1][rr];
                float x[4];
#pragma unroll
                for (int u = 0; u < 4; ++u) x[u] = tile[4 * q + u][rr] * f0 * f1;
                uint2 hi, lo;
                split_pair(x[0], x[1], hi.x, lo.x);
                split_pair(x[2], x[3], hi.y, lo.y);
                reinterpret_cast<uint2*>(base)[idx / 4] = hi;
                reinterpret_cast<uint2*>(base + part)[idx / 4] = lo;
            }
        }
        __syncthreads();
    }
}

// One 128-byte row of a stage holds 64 k on the FP16 path and 32 on the TF32 path; the four
// k-steps of a row are 32 bytes apart either way (+2 in a descriptor's 16-byte units).
template <bool TF32>
__device__ __forceinline__ void mma(float (&d)[BN / 2], unsigned long long a, unsigned long long b, int scale_d) {
    if (TF32)
        wgmma_tf32_ss<BN>(d, a, b, scale_d);
    else
        wgmma_f16_ss<BN>(d, a, b, scale_d);
}

// A consumer warpgroup's main loop over its k-tiles. FP16 path: acc (FP32) += hi*hi per flush of
// FLUSH k-steps, corr accumulates the cross terms over all of K on the tensor core. TF32 path:
// wgmma's order -- per flush of 4 k-steps, the cross terms first, the big products last, all
// into the flushed partial -- and the flushes summed in two levels, BLOCK_FLUSHES at a time in
// corr (the epilogue adds the last block), then into acc: with the cross terms over all of K in
// corr, FLUSH = 2 and one running sum it measured 1.15-1.29x cuBLAS FP32's error on wide-range
// inputs (docs/kernels.md, "The range check and the TF32 path").
#define BLOCK_FLUSHES 16
template <bool TF32>
__device__ __forceinline__ void consume(float (&acc)[MW][BN / 2], float (&corr)[MW][BN / 2], unsigned base,
                                        unsigned bars, int k_tiles, int c, int lane) {
    constexpr int flush = TF32 ? 4 : FLUSH;
    float part[MW][BN / 2];
    int flushes = 0;
    int stage = 0;
    unsigned phase = 0;
    for (int kt = 0; kt < k_tiles; ++kt) {
        mbar_wait(bars + 8 * stage, phase);
        const unsigned st = base + stage * STAGE_BYTES;
#pragma unroll
        for (int atom = 0; atom < ATOMS; ++atom) {
            const unsigned a_hi = st + atom * A_ATOM_BYTES, a_lo = a_hi + ATOMS * A_ATOM_BYTES;
            const unsigned b_hi = st + 2 * ATOMS * A_ATOM_BYTES + atom * B_ATOM_BYTES, b_lo = b_hi + ATOMS * B_ATOM_BYTES;
            const unsigned long long dbh = kmajor_sw128_desc(b_hi), dbl = kmajor_sw128_desc(b_lo);
#pragma unroll
            for (int f = 0; f < 4; f += flush) {
                wgmma_fence();
#pragma unroll
                for (int s = f; s < f + flush; ++s)
#pragma unroll
                    for (int mw = 0; mw < MW; ++mw) {
                        const unsigned rows = (MW * c + mw) * 64 * 128;  // this tile's 64 rows of A
                        const unsigned long long dah = kmajor_sw128_desc(a_hi + rows) + 2 * s;
                        const unsigned long long dal = kmajor_sw128_desc(a_lo + rows) + 2 * s;
                        if (TF32) {
                            mma<TF32>(part[mw], dah, dbl + 2 * s, s > f);
                            mma<TF32>(part[mw], dal, dbh + 2 * s, 1);
                        } else {
                            mma<TF32>(part[mw], dah, dbh + 2 * s, s > f);
                            mma<TF32>(corr[mw], dah, dbl + 2 * s, 1);
                            mma<TF32>(corr[mw], dal, dbh + 2 * s, 1);
                        }
                    }
                if (TF32) {
#pragma unroll
                    for (int s = f; s < f + flush; ++s)
#pragma unroll
                        for (int mw = 0; mw < MW; ++mw)
                            mma<TF32>(part[mw], kmajor_sw128_desc(a_hi + (MW * c + mw) * 64 * 128) + 2 * s,
                                      dbh + 2 * s, 1);
                }
                wgmma_commit();
                wgmma_wait_all();
                if (atom == ATOMS - 1 && f + flush == 4) {  // this warp is done with the stage
                    __syncwarp();
                    if (lane == 0) mbar_arrive(bars + 8 * (STAGES + stage));
                }
#pragma unroll
                for (int mw = 0; mw < MW; ++mw)
#pragma unroll
                    for (int j = 0; j < BN / 2; ++j) (TF32 ? corr : acc)[mw][j] += part[mw][j];
                if (TF32 && ++flushes == BLOCK_FLUSHES) {
                    flushes = 0;
#pragma unroll
                    for (int mw = 0; mw < MW; ++mw)
#pragma unroll
                        for (int j = 0; j < BN / 2; ++j) {
                            acc[mw][j] += corr[mw][j];
                            corr[mw][j] = 0.0f;
                        }
                }
            }
        }
        if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
        }
    }
}

extern "C" __global__ void __launch_bounds__(NT, 1)
gemm(GEMM_ARGS, const __grid_constant__ TmaDesc tmA16, const __grid_constant__ TmaDesc tmB16,
     const __grid_constant__ TmaDesc tmA32, const __grid_constant__ TmaDesc tmB32) {
    follow_previous_grid();
    extern __shared__ unsigned char smem_raw[];
    // Swizzled tiles must sit on 1024-byte boundaries: align the window (1 KiB of slack requested).
    const unsigned base = (smem_addr(smem_raw) + 1023) & ~1023u;
    const unsigned bars = base + STAGES * STAGE_BYTES;  // full[STAGES], then empty[STAGES]

    const int batch = BATCHED ? gridDim.z / SLICES : 1;
    const int entry = (int)BATCH_ENTRY;
    C += entry * stride_c;
    const Layout l = workspace_layout(M, N, K, splits, batch);
    const bool tf32 = at<int>(workspace, l.flags)[entry] != 0;
    const int tiles_m = DIV_UP(M, BM), tiles_n = DIV_UP(N, BN);
    int tile_m, tile_n;
    tile_coords(tile_m, tile_n, tiles_m, tiles_n, raster);
    const int m0 = tile_m * BM, n0 = tile_n * BN;
    const int k_step = ATOMS * (tf32 ? 32 : 64);  // K per stage
    const int k_tiles_all = DIV_UP(K, k_step);
    const int per_split = DIV_UP(k_tiles_all, SLICES);
    const int kt_begin = SLICE * per_split;
    const int k_tiles = max(0, min(k_tiles_all, kt_begin + per_split) - kt_begin);

    if (threadIdx.x == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(bars + 8 * s, 1);
            mbar_init(bars + 8 * (STAGES + s), WGS * 4);  // one arrival per consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        // Producer warpgroup: one thread issues every copy; the rest give their registers away.
#if WGS > 1
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
#endif
        if (threadIdx.x == 0) {
            const TmaDesc* ma = tf32 ? &tmA32 : &tmA16;
            const TmaDesc* mb = tf32 ? &tmB32 : &tmB16;
            asm volatile("prefetch.tensormap [%0];\n" ::"l"(ma) : "memory");
            asm volatile("prefetch.tensormap [%0];\n" ::"l"(mb) : "memory");
            const int per_atom = k_step / ATOMS;
            int stage = 0;
            unsigned phase = 0;
            for (int kt = 0; kt < k_tiles; ++kt) {
                mbar_wait(bars + 8 * (STAGES + stage), phase ^ 1);  // a fresh barrier's "previous phase" is complete
                const unsigned full = bars + 8 * stage;
                mbar_expect_tx(full, STAGE_BYTES);
                const unsigned st = base + stage * STAGE_BYTES;
                const int k0 = (kt_begin + kt) * k_step;
#pragma unroll
                for (int atom = 0; atom < ATOMS; ++atom) {
                    const int k = k0 + atom * per_atom;
                    const unsigned a = st + atom * A_ATOM_BYTES, b = st + 2 * ATOMS * A_ATOM_BYTES + atom * B_ATOM_BYTES;
                    tma_load_3d(a, ma, k, m0, 2 * entry, full);
                    tma_load_3d(a + ATOMS * A_ATOM_BYTES, ma, k, m0, 2 * entry + 1, full);
                    tma_load_3d(b, mb, k, n0, 2 * entry, full);
                    tma_load_3d(b + ATOMS * B_ATOM_BYTES, mb, k, n0, 2 * entry + 1, full);
                }
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
    // Consumer warpgroup c owns C rows [m0 + 64*MW*c, +64*MW) as MW wgmma tiles, all BN columns.
    const int c = wg - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    float acc[MW][BN / 2], corr[MW][BN / 2];
#pragma unroll
    for (int mw = 0; mw < MW; ++mw)
#pragma unroll
        for (int j = 0; j < BN / 2; ++j) acc[mw][j] = corr[mw][j] = 0.0f;
    if (tf32)
        consume<true>(acc, corr, base, bars, k_tiles, c, lane);
    else
        consume<false>(acc, corr, base, bars, k_tiles, c, lane);
    const float corr_scale = tf32 ? 1.0f : 1.0f / 2048.0f;

    // Accumulator j of tile mw holds C(row 16*warp + g + 8*((j/2)%2), col 8*(j/4) + 2t + j%2).
    // The FP16 path undoes each row's and column's scale: the thread's 2*MW row shifts and BN/4
    // column shifts, read before anything is stored (hopper.cuh, store_fragment, says why).
    int row_sh[MW][2], col_sh[BN / 4];
    const unsigned* amax = at<unsigned>(workspace, l.amax) + (long long)entry * M;
    const unsigned* bmax = at<unsigned>(workspace, l.bmax) + (long long)entry * N;
#pragma unroll
    for (int mw = 0; mw < MW; ++mw)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            row_sh[mw][h] = tf32 ? 0 : row_shift(amax[min(m0 + 64 * (MW * c + mw) + 16 * warp + g + 8 * h, M - 1)]);
#pragma unroll
    for (int q = 0; q < BN / 4; ++q)
        col_sh[q] = tf32 ? 0 : row_shift(bmax[min(n0 + 8 * (q >> 1) + 2 * t + (q & 1), N - 1)]);
#pragma unroll
    for (int mw = 0; mw < MW; ++mw) {
#pragma unroll
        for (int j = 0; j < BN / 2; ++j) {
            acc[mw][j] = fmaf(corr[mw][j], corr_scale, acc[mw][j]);
            if (!tf32) acc[mw][j] = ldexpf(acc[mw][j], -(row_sh[mw][(j >> 1) & 1] + col_sh[((j >> 2) << 1) | (j & 1)]));
        }
        const auto place = [&](int j, int& m, int& n) {
            m = m0 + 64 * (MW * c + mw) + 16 * warp + g + 8 * ((j >> 1) & 1);
            n = n0 + 8 * (j >> 2) + 2 * t + (j & 1);
        };
#if SPLIT
#pragma unroll
        for (int j = 0; j < BN / 2; ++j) {
            int m, n;
            place(j, m, n);
            if (m < M && n < N) workspace[(size_t)blockIdx.z * M * N + (size_t)m * N + n] = acc[mw][j];
        }
#else
        store_fragment<true>(acc[mw], place, M, N, alpha, beta, C, ldc, bias);
#endif
    }
}
