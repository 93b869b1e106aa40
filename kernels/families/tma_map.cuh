// A CUtensorMap, opaque: 128 bytes, 64-byte aligned, passed by value as a __grid_constant__.
struct __align__(64) TmaDesc {
    unsigned long long v[16];
};