// Warp tiling (rungs 6-8): block tile BM x BN -> warp tiles WM x WN -> per warp WMITER x WNITER
// sub-tiles, in each of which a lane owns a TM x TN patch. Needs THREADS, WM, WN, WNITER, TM, TN.
#define WMITER ((WM * WN) / (32 * TM * TN * WNITER))
#define WSUBM (WM / WMITER)
#define WSUBN (WN / WNITER)
#define FRAG_M (WMITER * TM)
#define FRAG_N (WNITER * TN)

struct WarpPos {
    int row, col;  // offset of this lane's first element inside the block tile
};

__device__ __forceinline__ WarpPos warp_position() {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wrow = warp / (BN / WN), wcol = warp % (BN / WN);
    const int lrow = lane / (WSUBN / TN), lcol = lane % (WSUBN / TN);
    return {wrow * WM + lrow * TM, wcol * WN + lcol * TN};
}

__device__ __forceinline__ void load_fragments(const float* As, const float* Bs, int kk, WarpPos p,
                                               float* ra, float* rb) {
#pragma unroll
    for (int mi = 0; mi < WMITER; ++mi)
#pragma unroll
        for (int i = 0; i < TM; i += 4)
            *reinterpret_cast<float4*>(ra + mi * TM + i) =
                *reinterpret_cast<const float4*>(As + kk * LDA_S + p.row + mi * WSUBM + i);
#pragma unroll
    for (int ni = 0; ni < WNITER; ++ni)
#pragma unroll
        for (int j = 0; j < TN; j += 4)
            *reinterpret_cast<float4*>(rb + ni * TN + j) =
                *reinterpret_cast<const float4*>(Bs + kk * LDB_S + p.col + ni * WSUBN + j);
}

// One BK-deep slice of the block tile. Fragments for step kk+1 are read from shared memory while
// step kk's FFMAs run (register double buffering).
__device__ __forceinline__ void warp_tile_mma(const float* As, const float* Bs, WarpPos p,
                                              float (&acc)[FRAG_M][FRAG_N]) {
    float ra[2][FRAG_M], rb[2][FRAG_N];
    load_fragments(As, Bs, 0, p, ra[0], rb[0]);
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
        if (kk + 1 < BK) load_fragments(As, Bs, kk + 1, p, ra[(kk + 1) & 1], rb[(kk + 1) & 1]);
#pragma unroll
        for (int i = 0; i < FRAG_M; ++i)
#pragma unroll
            for (int j = 0; j < FRAG_N; ++j) acc[i][j] += ra[kk & 1][i] * rb[kk & 1][j];
    }
}

__device__ __forceinline__ void warp_tile_store(float* C, int ldc, int M, int N, int row0, int col0,
                                                WarpPos p, const float (&acc)[FRAG_M][FRAG_N],
                                                float alpha, float beta, bool vec_c,
                                                const float* __restrict__ bias) {
#pragma unroll
    for (int mi = 0; mi < WMITER; ++mi)
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int ni = 0; ni < WNITER; ++ni)
#pragma unroll
                for (int j = 0; j < TN; j += 4)
                    store4(C, ldc, M, N, row0 + p.row + mi * WSUBM + i, col0 + p.col + ni * WSUBN + j,
                           &acc[mi * TM + i][ni * TN + j], alpha, beta, vec_c, bias);
}
