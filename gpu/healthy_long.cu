// A healthy workload for the "no false wedge" check: short kernels with a synchronize every
// 200 launches, and every 10 s one legitimately long kernel (3 s, timed by %globaltimer) that
// a thread waits for in cudaStreamSynchronize.   healthy_long RUN_S
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__device__ unsigned long long globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void long_kernel(unsigned long long ns) {
    unsigned long long start = globaltimer();
    while (globaltimer() - start < ns) {
    }
}

__global__ void short_kernel(float *x) { x[threadIdx.x] += 1.0f; }

static double now_s() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    double run_s = argc > 1 ? atof(argv[1]) : 60;
    float *x;
    cudaMalloc(&x, 256 * sizeof(float));
    cudaStream_t s;
    cudaStreamCreate(&s);
    double t0 = now_s(), next_long = t0 + 5;
    long launches = 0, longs = 0;
    while (now_s() - t0 < run_s) {
        for (int i = 0; i < 200; i++, launches++) short_kernel<<<1, 256, 0, s>>>(x);
        if (now_s() >= next_long) {
            long_kernel<<<1, 1, 0, s>>>(3000000000ull);
            longs++;
            next_long += 10;
        }
        cudaStreamSynchronize(s);
    }
    printf("healthy_long: %ld short kernels, %ld long ones, %s\n", launches, longs,
           cudaGetErrorString(cudaGetLastError()));
    return 0;
}
