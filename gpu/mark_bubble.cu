// What a stream mark costs the GPU, apart from the host. The 2026-12-02 measurements put the
// marks at ~2 points of eager decode, about twice their host time (BENCHMARKS.md): either the
// stream stalls around each mark (a wait for idle before the write), or the driver's next
// launch pays. This prices the first: the host queues everything behind a gate kernel
// first, so the GPU then runs the queue back to back and the host is out of the picture;
// the stream's GPU time per kernel, with a mark every N kernels against none, is the bubble.
// Variants: none, stream write (the shim's default, with the driver's memory fence), stream
// write without the fence, event record; every 16 kernels (the default cadence) and after
// every kernel (to make the bubble large against the noise).
// Never wedges: the gate releases when the host sets a pinned flag, and by itself after 5 s.
//   nvcc -O2 -arch=sm_90 -o mark_bubble gpu/mark_bubble.cu -lcuda && ./mark_bubble [ROUNDS]
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(x)                                                                \
    do {                                                                        \
        CUresult r_ = (x);                                                      \
        if (r_ != CUDA_SUCCESS) {                                               \
            fprintf(stderr, "%s failed: %d\n", #x, (int)r_);                    \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

static __device__ __forceinline__ uint64_t globaltimer() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Waits for the host's flag, or 5 s.
__global__ void gate_kernel(volatile int *flag) {
    uint64_t deadline = globaltimer() + 5000000000ull;
    while (*flag == 0 && globaltimer() < deadline) {
    }
}

// ~`ns` of work on one warp: a decode step's small kernels run a few µs each.
__global__ void work_kernel(uint64_t ns) {
    uint64_t end = globaltimer() + ns;
    while (globaltimer() < end) {
    }
}

enum Mark { NONE, WRITE, WRITE_NO_FENCE, EVENT };
static const char *mark_name[] = {"none", "stream write", "stream write, no fence", "event record"};

// GPU ms for `kernels` kernels of `ns` each, a mark of `kind` after every `every`th.
static float run(CUstream s, volatile int *flag, int *dev_flag, CUdeviceptr word, CUevent *ring, Mark kind,
                 int every, int kernels, uint64_t ns, int *marks) {
    CUevent start, end;
    CHECK(cuEventCreate(&start, CU_EVENT_DEFAULT));
    CHECK(cuEventCreate(&end, CU_EVENT_DEFAULT));
    *flag = 0;
    gate_kernel<<<1, 1, 0, (cudaStream_t)s>>>(dev_flag);
    CHECK(cuEventRecord(start, s));
    *marks = 0;
    for (int i = 0; i < kernels; i++) {
        work_kernel<<<1, 32, 0, (cudaStream_t)s>>>(ns);
        if (kind != NONE && i % every == every - 1) {
            if (kind == EVENT) {
                CHECK(cuEventRecord(ring[*marks % 64], s));
            } else {
                CHECK(cuStreamWriteValue64(s, word, (uint64_t)i + 1,
                                           kind == WRITE_NO_FENCE
                                               ? CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER
                                               : 0));
            }
            (*marks)++;
        }
    }
    CHECK(cuEventRecord(end, s));
    *flag = 1;  // the host releases the gate once everything is queued
    CHECK(cuStreamSynchronize(s));
    float ms = 0;
    CHECK(cuEventElapsedTime(&ms, start, end));
    CHECK(cuEventDestroy(start));
    CHECK(cuEventDestroy(end));
    return ms;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
    cudaFree(0);
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    int *flag;
    CHECK(cuMemHostAlloc((void **)&flag, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    CUdeviceptr dev_flag_ptr;
    CHECK(cuMemHostGetDevicePointer(&dev_flag_ptr, flag, 0));
    int *dev_flag = (int *)dev_flag_ptr;
    uint64_t *host_word;
    CUdeviceptr word;
    CHECK(cuMemHostAlloc((void **)&host_word, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    CHECK(cuMemHostGetDevicePointer(&word, host_word, 0));
    // Each primitive tried once before measuring, its result printed (not exit): on the H200
    // (2026-12-02) the first stream write of this program failed with
    // CUDA_ERROR_INVALID_VALUE while the shim's writes to the same kind of memory worked.
    int dev = 0;
    CUdevice cu_dev;
    CHECK(cuCtxGetDevice(&cu_dev));
    CHECK(cuDeviceGetAttribute(&dev, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, cu_dev));
    printf("CAN_USE_64_BIT_STREAM_MEM_OPS: %d\n", dev);
    CUdeviceptr dev_word;
    CHECK(cuMemAlloc(&dev_word, 4096));
    struct { const char *what; CUdeviceptr at; unsigned flags; } probes[] = {
        {"host-mapped word, fence", word, 0},
        {"host-mapped word, no fence", word, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER},
        {"device word, fence", dev_word, 0},
        {"device word, no fence", dev_word, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER},
    };
    int ok[4];
    for (int i = 0; i < 4; i++) {
        auto &p = probes[i];
        CUresult r = cuStreamWriteValue64(s, p.at, 7, p.flags);
        CUresult q = r == CUDA_SUCCESS ? cuStreamSynchronize(s) : r;
        const char *msg = "";
        cuGetErrorName(q, &msg);
        printf("probe: cuStreamWriteValue64 %-28s -> %d %s\n", p.what, (int)q, msg);
        ok[i] = q == CUDA_SUCCESS;
    }
    // The shim writes host-mapped words; where those fail here, the device word stands in
    // (said in the output) so that the stream's price of a write is still measured.
    bool host = ok[0];
    if (!host) word = dev_word;
    bool variant_ok[4] = {true, host ? (bool)ok[0] : (bool)ok[2], host ? (bool)ok[1] : (bool)ok[3], true};
    printf("writes measured on the %s word\n", host ? "host-mapped" : "device");
    printf("host word after the probes: %llu\n", (unsigned long long)host_word[0]);
    CUevent ring[64];
    for (int i = 0; i < 64; i++) CHECK(cuEventCreate(&ring[i], CU_EVENT_DISABLE_TIMING));
    // 300 kernels and up to 300 marks stay well under the driver's queue (~1,000 launches
    // on the H200): nothing blocks the host before the gate opens (if it did, the gate's
    // deadline would open it after 5 s and that run's figure would show it).
    const int kernels = 300;
    const uint64_t ns_list[] = {2000, 8000};
    const Mark kinds[] = {NONE, WRITE, WRITE_NO_FENCE, EVENT};
    const int everys[] = {16, 1};
    int marks = 0;
    run(s, flag, dev_flag, word, ring, NONE, 1, kernels, 2000, &marks);  // warm-up
    for (uint64_t ns : ns_list) {
        for (int every : everys) {
            // Sums over rounds, the variants interleaved within each round.
            double sum[4] = {0, 0, 0, 0};
            int nmarks[4] = {0, 0, 0, 0};
            for (int r = 0; r < rounds; r++) {
                for (int k = 0; k < 4; k++) {
                    Mark kind = kinds[(k + r) % 4];
                    if (!variant_ok[kind]) continue;
                    sum[kind] += run(s, flag, dev_flag, word, ring, kind, every, kernels, ns, &marks);
                    nmarks[kind] = marks;
                }
            }
            double none_us = sum[NONE] / rounds * 1000.0;
            printf("kernels of %llu ns, a mark every %d: none %.1f us for %d kernels (%.3f us each)\n",
                   (unsigned long long)ns, every, none_us, kernels, none_us / kernels);
            for (int k = 1; k < 4; k++) {
                if (!variant_ok[k]) {
                    printf("  %-24s not measured: the probe write failed\n", mark_name[k]);
                    continue;
                }
                double us = sum[k] / rounds * 1000.0;
                printf("  %-24s %.1f us, %+.3f us a mark (%d marks)\n", mark_name[k], us,
                       (us - none_us) / nmarks[k], nmarks[k]);
            }
        }
    }
    printf("last word %llu\n", (unsigned long long)host_word[0]);
    return 0;
}
