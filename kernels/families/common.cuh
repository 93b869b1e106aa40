// Shared by every family. Parameters arrive as macros defined ahead of this text.
// Row-major A (M x K, lda), B (K x N, ldb), C (M x N, ldc); C = alpha*A*B + beta*C.
#define DIV_UP(a, b) (((a) + (b) - 1) / (b))

#define GEMM_ARGS                                                                        \
    int M, int N, int K, float alpha, const float* __restrict__ A, int lda,              \
        const float* __restrict__ B, int ldb, float beta, float* __restrict__ C, int ldc, \
        float* __restrict__ workspace, int splits, int raster

// Launch-time values, passed as the last two arguments so that configs differing only in them
// share one compiled program (issue 19: fewer compiles): `splits`, the slices of K (gridDim.z of
// the GEMM launch; the program's SPLIT macro says only whether there are several), and `raster`.
// SLICES is `splits` where the program slices K and a constant 1 where it does not, so that an
// unsliced kernel's K loop compiles as it did with a constant (it measured ~2% faster so).
#define SLICES (SPLIT ? splits : 1)

// Block order: groups of `raster` tile-rows are walked column by column, so blocks that run at
// the same time share A rows and B columns in L2. raster = 1 is plain row-major order (families
// without a RASTER parameter pass a literal 1, which folds away).
__device__ __forceinline__ void tile_coords(int& tile_m, int& tile_n, int tiles_m, int tiles_n, int raster) {
    const int pid = blockIdx.x;
    const int width = raster * tiles_n;
    const int group = pid / width;
    const int first_m = group * raster;
    const int rows = min(tiles_m - first_m, raster);
    const int in_group = pid - group * width;
    tile_m = first_m + in_group % rows;
    tile_n = in_group / rows;
}

// beta == 0 never reads C, so NaNs already in C do not leak into the result.
__device__ __forceinline__ float epilogue(float acc, float alpha, float beta, const float* c) {
    return beta == 0.0f ? alpha * acc : alpha * acc + beta * *c;
}

__device__ __forceinline__ bool aligned16(const void* p) {
    return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0;
}

// The sum of S partials of one output, S a constant: its loads are unrolled (in flight together).
template <int S>
__device__ __forceinline__ float sum_slices(const float* __restrict__ w, long long mn, long long idx) {
    float sum = 0.0f;
#pragma unroll 4
    for (int s = 0; s < S; ++s) sum += w[s * mn + idx];
    return sum;
}

// Sums the `splits` partial products in workspace ([splits][M][N]) into C. Same signature as
// every kernel so that one launcher serves all families.
#if SPLIT
extern "C" __global__ void gemm_splitk_reduce(GEMM_ARGS) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long mn = (long long)M * N;
    if (idx >= mn) return;
    // One constant-count loop per count the families offer: a loop bounded at run time issued
    // its loads one by one (splitk 1024^3, SPLITK 2: -2%; bench/NOTES.md, session 12).
    float sum = 0.0f;
    switch (splits) {
        case 2: sum = sum_slices<2>(workspace, mn, idx); break;
        case 4: sum = sum_slices<4>(workspace, mn, idx); break;
        case 8: sum = sum_slices<8>(workspace, mn, idx); break;
        case 16: sum = sum_slices<16>(workspace, mn, idx); break;
        case 32: sum = sum_slices<32>(workspace, mn, idx); break;
        default:
            for (int s = 0; s < splits; ++s) sum += workspace[s * mn + idx];
    }
    const int row = (int)(idx / N), col = (int)(idx % N);
    float* c = C + (size_t)row * ldc + col;
    *c = epilogue(sum, alpha, beta, c);
}
#endif
