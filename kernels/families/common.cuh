// Shared by every family. Parameters arrive as macros defined ahead of this text, with the
// problem's layout: TA (A is stored transposed: element (m, k) at A[k * lda + m]) and TB (B is
// stored transposed: element (k, n) at B[n * ldb + k]); otherwise A (M x K) and B (K x N) are
// row-major. C (M x N) is row-major with leading dimension ldc. C = alpha*op(A)*op(B) + beta*C,
// plus bias[n] on every row in a BIAS program.
//
// BATCHED programs take a batch: gridDim.z = batch * SLICES, and batch entry b reads
// A + b*stride_a, B + b*stride_b and writes C + b*stride_c (strides in elements; one bias for
// every entry). Batches and the bias are compiled in, as SPLIT is, so a single GEMM without a
// bias compiles to the code it had before either existed (their offsets and loads changed the
// register allocation of configs near the limit, spills included).
#define DIV_UP(a, b) (((a) + (b) - 1) / (b))
#ifndef TA
#define TA 0
#endif
#ifndef TB
#define TB 0
#endif
#ifndef BATCHED
#define BATCHED 0
#endif
#ifndef BIAS
#define BIAS 0
#endif

#define GEMM_ARGS                                                                                    \
    int M, int N, int K, float alpha, const float* __restrict__ A, int lda,                          \
        const float* __restrict__ B, int ldb, float beta, float* __restrict__ C, int ldc,             \
        float* __restrict__ workspace, const float* __restrict__ bias, long long stride_a,            \
        long long stride_b, long long stride_c, int splits, int raster

// Element accessors for the families that read A and B one element at a time. (The second
// index is left unparenthesized on purpose: `A_AT(r, k0 + c)` is then the very expression the
// layout-free code wrote, and compiles as it did.)
#if TA
#define A_AT(m, k) A[(size_t)(k) * lda + m]
#else
#define A_AT(m, k) A[(size_t)(m) * lda + k]
#endif
#if TB
#define B_AT(k, n) B[(size_t)(n) * ldb + k]
#else
#define B_AT(k, n) B[(size_t)(k) * ldb + n]
#endif

// Launch-time values, passed as the last two arguments so that configs differing only in them
// share one compiled program (issue 19: fewer compiles): `splits`, the slices of K (gridDim.z of
// the GEMM launch; the program's SPLIT macro says only whether there are several), and `raster`.
// SLICES is `splits` where the program slices K and a constant 1 where it does not, so that an
// unsliced kernel's K loop compiles as it did with a constant (it measured ~2% faster so).
#define SLICES (SPLIT ? splits : 1)
// blockIdx.z = batch entry * SLICES + slice of K (the slice is a constant 0 where K is not sliced).
#if BATCHED
#define SLICE ((int)(blockIdx.z % SLICES))
#define BATCH_ENTRY ((long long)(blockIdx.z / SLICES))
#else
#define SLICE ((int)blockIdx.z)
#define BATCH_ENTRY 0ll
#endif
// Moves A, B and C to this block's batch entry (the pointers are the kernel's own copies).
#if BATCHED
#define SELECT_BATCH_ENTRY()                       \
    do {                                           \
        const long long entry_ = BATCH_ENTRY;      \
        A += entry_ * stride_a;                    \
        B += entry_ * stride_b;                    \
        C += entry_ * stride_c;                    \
    } while (0)
#else
#define SELECT_BATCH_ENTRY() \
    do {                     \
    } while (0)
#endif

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

// beta == 0 never reads C, so NaNs already in C do not leak into the result. `col` indexes the
// bias vector (read in BIAS programs only).
__device__ __forceinline__ float epilogue(float acc, float alpha, float beta, const float* c,
                                          const float* __restrict__ bias, int col) {
    const float v = beta == 0.0f ? alpha * acc : alpha * acc + beta * *c;
#if BIAS
    return bias ? v + bias[col] : v;  // null for split-K partials: the reduction adds it
#else
    return v;
#endif
}

__device__ __forceinline__ bool aligned16(const void* p) {
    return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0;
}

// Programmatic dependent launch (sm_90): a kernel launched with it (Launch.follows) may start
// while the kernel before it in the stream still runs, hiding the gap between the two. It must
// call this before touching global memory: it waits until that kernel has ended and its writes
// are visible, then lets the next kernel start early the same way. Letting it start only after
// this wait, never before, means no kernel overlaps more than the one it follows (a pre-pass of
// the next call never rewrites a workspace a GEMM still reads). Without the launch attribute
// both instructions do nothing (docs/kernels.md, "Launches that overlap their predecessor").
__device__ __forceinline__ void follow_previous_grid() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// The sum of S partials of one output, S a constant: its loads are unrolled (in flight together).
template <int S>
__device__ __forceinline__ float sum_slices(const float* __restrict__ w, long long mn, long long idx) {
    float sum = 0.0f;
#pragma unroll 4
    for (int s = 0; s < S; ++s) sum += w[s * mn + idx];
    return sum;
}

// Sums the `splits` partial products in workspace ([batch][splits][M][N]) into C. Same signature
// as every kernel so that one launcher serves all families; its grid is (M*N / threads, batch).
#if SPLIT
extern "C" __global__ void gemm_splitk_reduce(GEMM_ARGS) {
    follow_previous_grid();
    const long long at = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long mn = (long long)M * N;
    if (at >= mn) return;
    const long long entry = blockIdx.y;
    const float* w = workspace + entry * splits * mn + at;
    // One constant-count loop per count the families offer: a loop bounded at run time issued
    // its loads one by one (splitk 1024^3, SPLITK 2: -2%; docs/kernels.md, "RASTER and SPLITK
    // as launch-time parameters").
    float sum = 0.0f;
    switch (splits) {
        case 2: sum = sum_slices<2>(w, mn, 0); break;
        case 4: sum = sum_slices<4>(w, mn, 0); break;
        case 8: sum = sum_slices<8>(w, mn, 0); break;
        case 16: sum = sum_slices<16>(w, mn, 0); break;
        case 32: sum = sum_slices<32>(w, mn, 0); break;
        default:
            for (int s = 0; s < splits; ++s) sum += w[s * mn];
    }
    const int row = (int)(at / N), col = (int)(at % N);
    float* c = C + entry * stride_c + (size_t)row * ldc + col;
    *c = epilogue(sum, alpha, beta, c, bias, col);
}
#endif
