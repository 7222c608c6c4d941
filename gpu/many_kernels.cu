// The shim's cost per launch when a loop launches many distinct kernels, as a
// model's decode step does (tens of kernels) — the one-kernel loop of launch_bench.cu hides
// per-kernel caching. Prints the kernels' handles (their spacing decides how a cache indexed
// by low bits fares) and the wall time per launch; run it under
// WEDGEPROBE_SHIM_MEASURE=self_cost to get the shim's own ns per launch.
//   nvcc -O2 -arch=sm_90 -o many_kernels gpu/many_kernels.cu && ./many_kernels [N_LAUNCHES] [KINDS]
#include <stdint.h>
#include <time.h>

#include "reproducer.cuh"

template <int N>
__global__ void kind(float *p) {
    if (p) p[N] = N;
}

typedef void (*Kernel)(float *);
#define K4(b) kind<b>, kind<b + 1>, kind<b + 2>, kind<b + 3>
#define K16(b) K4(b), K4(b + 4), K4(b + 8), K4(b + 12)
static Kernel kinds[64] = {K16(0), K16(16), K16(32), K16(48)};

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 300000;
    int k = argc > 2 ? atoi(argv[2]) : 48;
    if (k < 1 || k > 64) k = 48;
    CHECK(cudaFree(0));
    printf("handles:");
    for (int i = 0; i < 8; i++) {
        cudaFunction_t f;
        CHECK(cudaGetFuncBySymbol(&f, (const void *)kinds[i]));
        printf(" %p", (void *)f);
    }
    printf("\n");
    for (int i = 0; i < k; i++) kinds[i]<<<1, 1>>>(nullptr);
    CHECK(cudaDeviceSynchronize());
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) {
        kinds[i % k]<<<1, 1>>>(nullptr);
        if (i % 1000 == 999) CHECK(cudaDeviceSynchronize());
    }
    CHECK(cudaDeviceSynchronize());
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
    printf("kinds %d launches %ld wall_ns_per_launch %.1f\n", k, n, ns / n);
    return 0;
}
