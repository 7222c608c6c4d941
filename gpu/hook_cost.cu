// What each piece of the shim's launch hook costs on the real driver, one call at a
// time (the hook does all of these per launch, or per 8 launches for the mark). The launch
// hook measured +99 ns a launch on the simulated driver but ~+1 µs on the H200 (BENCHMARKS.md,
// 2026-12-01): this says which piece the H200 charges for.
//   nvcc -O2 -arch=sm_90 -o hook_cost gpu/hook_cost.cu -lcuda && ./hook_cost
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

__global__ void empty_kernel() {}

static double now_ns() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

#define CHECK(x)                                                                \
    do {                                                                        \
        CUresult r_ = (x);                                                      \
        if (r_ != CUDA_SUCCESS) {                                               \
            fprintf(stderr, "%s failed: %d\n", #x, (int)r_);                    \
            return 1;                                                           \
        }                                                                       \
    } while (0)

int main() {
    const int n = 200000;
    cudaFree(0);
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    uint64_t *host;
    CUdeviceptr dev;
    CHECK(cuMemHostAlloc((void **)&host, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
    CHECK(cuMemHostGetDevicePointer(&dev, host, 0));
    struct timespec ts;
    double t0, t1;

    const clockid_t ids[] = {CLOCK_MONOTONIC, CLOCK_MONOTONIC_COARSE, CLOCK_REALTIME,
                             CLOCK_THREAD_CPUTIME_ID};
    const char *names[] = {"clock MONOTONIC", "clock MONOTONIC_COARSE", "clock REALTIME",
                           "clock THREAD_CPUTIME"};
    for (int k = 0; k < 4; k++) {
        t0 = now_ns();
        for (int i = 0; i < n; i++) clock_gettime(ids[k], &ts);
        t1 = now_ns();
        printf("%-28s %8.1f ns/call\n", names[k], (t1 - t0) / n);
    }
    uint64_t acc = 0;
    t0 = now_ns();
    for (int i = 0; i < n; i++) acc ^= __builtin_ia32_rdtsc();
    t1 = now_ns();
    printf("%-28s %8.1f ns/call (%d)\n", "rdtsc", (t1 - t0) / n, (int)(acc & 1));

    CUcontext c;
    t0 = now_ns();
    for (int i = 0; i < n; i++) cuCtxGetCurrent(&c);
    t1 = now_ns();
    printf("%-28s %8.1f ns/call\n", "cuCtxGetCurrent", (t1 - t0) / n);
    CUdevice d;
    t0 = now_ns();
    for (int i = 0; i < n; i++) cuCtxGetDevice(&d);
    t1 = now_ns();
    printf("%-28s %8.1f ns/call\n", "cuCtxGetDevice", (t1 - t0) / n);
    CUstreamCaptureStatus st;
    t0 = now_ns();
    for (int i = 0; i < n; i++) cuStreamIsCapturing(s, &st);
    t1 = now_ns();
    printf("%-28s %8.1f ns/call\n", "cuStreamIsCapturing", (t1 - t0) / n);

    // Launches and marks into a stream drained every 1000 calls (the queue never fills).
    CUfunction f;
    cudaFunction_t rf;
    if (cudaGetFuncBySymbol(&rf, (const void *)empty_kernel) != cudaSuccess) return 1;
    f = (CUfunction)rf;
    CUevent ev;
    CHECK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    for (int round = 0; round < 2; round++) {
        double alone = 0, with = 0;
        for (int part = 0; part < 2; part++) {
            CHECK(cuCtxSynchronize());
            t0 = now_ns();
            for (int i = 0; i < n; i++) {
                if (part == 1) CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
                CHECK(cuEventRecord(ev, s));
                if (i % 1000 == 999) CHECK(cuStreamSynchronize(s));
            }
            CHECK(cuStreamSynchronize(s));
            t1 = now_ns();
            if (part == 0) alone = (t1 - t0) / n;
            else with = (t1 - t0) / n;
        }
        t0 = now_ns();
        for (int i = 0; i < n; i++) cuEventQuery(ev);
        t1 = now_ns();
        printf("round %d: cuEventRecord %.1f ns alone, launch+record %.1f ns; cuEventQuery %.1f ns\n",
               round, alone, with, (t1 - t0) / n);
    }
    for (int round = 0; round < 3; round++) {
        double launch = 0, mark = 0, both = 0;
        for (int part = 0; part < 3; part++) {
            CHECK(cuCtxSynchronize());
            t0 = now_ns();
            for (int i = 0; i < n; i++) {
                if (part != 1) CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
                if (part != 0) CHECK(cuStreamWriteValue64(s, dev, (uint64_t)i, 0));
                if (i % 1000 == 999) CHECK(cuStreamSynchronize(s));
            }
            CHECK(cuStreamSynchronize(s));
            t1 = now_ns();
            double per = (t1 - t0) / n;
            if (part == 0) launch = per;
            else if (part == 1) mark = per;
            else both = per;
        }
        printf("round %d: cuLaunchKernel %.1f ns, cuStreamWriteValue64 %.1f ns, both %.1f ns "
               "(host %llu)\n",
               round, launch, mark, both, (unsigned long long)host[0]);
    }
    return 0;
}
