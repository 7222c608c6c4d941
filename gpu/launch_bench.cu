// The launch-bound loop of BENCHMARKS.md on the real driver: N empty-kernel launches through
// the runtime, a sync every 1000 so the queue never fills; prints the launching thread's CPU
// time per launch (the same line as `simworker bench`). DELAY_S lets a probe attach first.
//   launch_bench N [DELAY_S]
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

__global__ void empty_kernel() {}

static double clock_s(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 200000;
    double delay = argc > 2 ? atof(argv[2]) : 0;
    cudaFree(0);
    for (int i = 0; i < 1000; i++) empty_kernel<<<1, 1>>>();
    cudaDeviceSynchronize();
    if (delay > 0) usleep((useconds_t)(delay * 1e6));
    double c0 = clock_s(CLOCK_THREAD_CPUTIME_ID), w0 = clock_s(CLOCK_MONOTONIC);
    for (long i = 0; i < n; i++) {
        empty_kernel<<<1, 1>>>();
        if (i % 1000 == 999) cudaDeviceSynchronize();
    }
    cudaDeviceSynchronize();
    double cpu = clock_s(CLOCK_THREAD_CPUTIME_ID) - c0, wall = clock_s(CLOCK_MONOTONIC) - w0;
    printf("launches %ld wall_ns_per_launch %.1f thread_cpu_ns_per_launch %.1f\n", n,
           wall * 1e9 / n, cpu * 1e9 / n);
    return 0;
}
