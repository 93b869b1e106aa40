// Two-level sums over K for the FFMA ladder (docs/kernels.md, "Blocked sums over K"): the
// products of SUM_CHUNK consecutive values of k accumulate from zero in one set of registers
// (`part`), which then folds into the running total (`total`), a second set. One FP32 register
// carried over all of K rounds against an ever larger sum, so its error grows with K; two levels
// keep both runs short (SUM_CHUNK terms, then K / SUM_CHUNK), which puts the ladder at or below
// cuBLAS FP32's error where cuBLAS splits K.
#define SUM_CHUNK 64

// Whether the partial sums fold after k-tile t (counted from 0) of a loop over tiles `depth`
// values of k deep. Depths are powers of two; a tile as deep as SUM_CHUNK or deeper folds each time.
#define FOLD_AFTER(t, depth) ((depth) >= SUM_CHUNK || ((t) + 1) % (SUM_CHUNK / (depth)) == 0)

__device__ __forceinline__ void fold_sums(float& total, float& part) {
    total += part;
    part = 0.0f;
}

template <int N>
__device__ __forceinline__ void fold_sums(float (&total)[N], float (&part)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) fold_sums(total[i], part[i]);
}

template <int R, int C>
__device__ __forceinline__ void fold_sums(float (&total)[R][C], float (&part)[R][C]) {
#pragma unroll
    for (int i = 0; i < R; ++i) fold_sums(total[i], part[i]);
}
