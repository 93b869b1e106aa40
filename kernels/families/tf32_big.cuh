__device__ __forceinline__ unsigned tf32_big(float x) {
    unsigned big;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(big) : "f"(x));
    return big;
}