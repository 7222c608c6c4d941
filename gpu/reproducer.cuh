// What every GPU reproducer here shares: fail loudly on a CUDA error, and read the GPU's
// nanosecond clock so a spinning kernel can give up at a deadline (a reproducer must never
// leave the GPU wedged).
#pragma once
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

// `err_`, not `e`: a caller's variable named `e` must not be shadowed (it was, once).
#define CHECK(x)                                                                   \
    do {                                                                           \
        cudaError_t err_ = (x);                                                    \
        if (err_ != cudaSuccess) {                                                 \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x,              \
                    cudaGetErrorString(err_));                                     \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

__device__ __forceinline__ unsigned long long globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
