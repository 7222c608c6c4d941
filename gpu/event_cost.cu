// What a stream mark costs the launching thread where the shim writes it
// — after a launch, every 8th launch — by primitive (an event record, a stream write), by
// stream (the legacy default stream, as PyTorch and `<<<>>>` use; a created blocking or
// non-blocking stream) and by how many distinct events are cycled (the shim's ring holds 512
// per stream). In the shim an event mark measured 340–760 ns (self_cost, 2026-12-01) against
// 134–153 ns for one event re-recorded on a created stream (gpu/hook_cost.cu, 2026-12-01).
// Prints, per case, the loop's ns per launch, the ns per mark timed around the call, and the
// marginal ns per mark (loop time against the same loop without marks).
//   nvcc -O2 -arch=sm_90 -o event_cost gpu/event_cost.cu -lcuda && ./event_cost
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

enum { NONE, EVENT, WRITE };
static CUevent events[512];
static CUdeviceptr word;

// One loop of n launches, a mark after every 8th: returns ns per launch; *mark_ns the mean
// time inside the mark calls.
static int loop(CUfunction f, CUstream s, int kind, int nevents, int n, double *per_launch,
                double *mark_ns) {
    double in_marks = 0;
    int marks = 0, k = 0;
    CHECK(cuCtxSynchronize());
    double t0 = now_ns();
    for (int i = 0; i < n; i++) {
        CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
        if (kind != NONE && i % 8 == 7) {
            double a = now_ns();
            if (kind == EVENT) CHECK(cuEventRecord(events[k++ % nevents], s));
            else CHECK(cuStreamWriteValue64(s, word, (uint64_t)i, 0));
            in_marks += now_ns() - a;
            marks++;
        }
        if (i % 1000 == 999) CHECK(cuStreamSynchronize(s));
    }
    CHECK(cuStreamSynchronize(s));
    *per_launch = (now_ns() - t0) / n;
    *mark_ns = marks ? in_marks / marks : 0;
    return 0;
}

int main() {
    const int n = 160000;
    cudaFree(0);
    cudaFunction_t rf;
    if (cudaGetFuncBySymbol(&rf, (const void *)empty_kernel) != cudaSuccess) return 1;
    CUfunction f = (CUfunction)rf;
    for (int i = 0; i < 512; i++) CHECK(cuEventCreate(&events[i], CU_EVENT_DISABLE_TIMING));
    uint64_t *host;
    CHECK(cuMemHostAlloc((void **)&host, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
    CHECK(cuMemHostGetDevicePointer(&word, host, 0));
    CUstream blocking, nonblocking;
    CHECK(cuStreamCreate(&blocking, CU_STREAM_DEFAULT));
    CHECK(cuStreamCreate(&nonblocking, CU_STREAM_NON_BLOCKING));
    struct { const char *name; CUstream s; } streams[] = {
        {"legacy", (CUstream)0}, {"blocking", blocking}, {"non-blocking", nonblocking}};
    struct { const char *name; int kind, nevents; } cases[] = {
        {"none", NONE, 1},        {"event x1", EVENT, 1},   {"event x8", EVENT, 8},
        {"event x64", EVENT, 64}, {"event x512", EVENT, 512}, {"write", WRITE, 1}};
    for (int round = 0; round < 2; round++) {
        for (int si = 0; si < 3; si++) {
            double base = 0;
            for (int c = 0; c < 6; c++) {
                double per, mark;
                if (loop(f, streams[si].s, cases[c].kind, cases[c].nevents, n, &per, &mark))
                    return 1;
                if (cases[c].kind == NONE) base = per;
                printf("round %d %-12s %-10s %7.1f ns/launch, %6.1f ns in each mark call, "
                       "%+7.1f ns per mark marginal\n",
                       round, streams[si].name, cases[c].name, per, mark,
                       cases[c].kind == NONE ? 0.0 : (per - base) * 8);
            }
        }
    }
    return 0;
}
