// ---- mbarrier, TMA and wgmma primitives (PTX, sm_90) ---------------------------------------
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    unsigned done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}
__device__ __forceinline__ void tma_load_3d(unsigned dst, const TmaDesc* map, int c0, int c1, int c2,
                                            unsigned bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4}], [%5];\n"
                 ::"r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar) : "memory");
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

// Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart.
__device__ __forceinline__ unsigned long long kmajor_sw128_desc(unsigned addr) {
    return (unsigned long long)((addr & 0x3ffff) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}

// Element (row r, column j < 32) of a TMA box whose rows are 128 bytes, 128-byte swizzle: the
// 16-byte chunk index is XORed with the row index mod 8 (boxes are 1024-byte aligned).
__device__ __forceinline__ unsigned sw128(unsigned box, int r, int j) {
    return box + r * 128 + ((((j >> 2) ^ r) & 7) << 4) + (j & 3) * 4;
}

// Stores COUNT values of a consumer thread's wgmma accumulator fragment, value j at C(m, n) as
// place(j, m, n) says: C = alpha*v + beta*C (+ bias[n]), EPILOGUE_CHUNK values at a time, each
// chunk's reads of C and of the bias issued together before its stores: read behind each value's
// own bounds check, they could not be issued ahead and the values waited for them in turn
// (docs/kernels.md, "The epilogue"). PAIRS: values j and j + 1 (j even) sit at n and n + 1 of one
// row, stored as one float2 where C's rows allow it: whole 32-byte sectors per row of a warp's
// store, not halves.
#define EPILOGUE_CHUNK 16
template <bool PAIRS, int COUNT, typename Place>
__device__ __forceinline__ void store_fragment(const float (&v)[COUNT], Place place, int M, int N, float alpha,
                                               float beta, float* __restrict__ C, int ldc,
                                               const float* __restrict__ bias) {
    const bool pairs = PAIRS && (ldc % 2 == 0) && (reinterpret_cast<unsigned long long>(C) % 8 == 0);
#pragma unroll
    for (int j0 = 0; j0 < COUNT; j0 += EPILOGUE_CHUNK) {
        float r[EPILOGUE_CHUNK], add[EPILOGUE_CHUNK];  // C's old values and the bias, then the results
#pragma unroll
        for (int u = 0; u < EPILOGUE_CHUNK && j0 + u < COUNT; ++u) {
            int m, n;
            place(j0 + u, m, n);
            const bool in = m < M && n < N;
            r[u] = beta != 0.0f && in ? C[(size_t)m * ldc + n] : 0.0f;
            add[u] = BIAS && bias != nullptr && in ? bias[n] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < EPILOGUE_CHUNK && j0 + u < COUNT; ++u)
            r[u] = epilogue(v[j0 + u], alpha, beta, &r[u], bias != nullptr ? &add[u] : nullptr, 0);
#pragma unroll
        for (int u = 0; u < EPILOGUE_CHUNK && j0 + u < COUNT; u += PAIRS ? 2 : 1) {
            int m, n;
            place(j0 + u, m, n);
            float* out = C + (size_t)m * ldc + n;
            if (PAIRS && pairs && m < M && n + 1 < N) {
                *reinterpret_cast<float2*>(out) = make_float2(r[u], r[u + 1]);
            } else {
                if (m < M && n < N) out[0] = r[u];
                if (PAIRS && m < M && n + 1 < N) out[1] = r[u + 1];
            }
        }
    }
}
