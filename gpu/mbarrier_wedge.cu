// A reproducer of the production wedge: a kernel spins in an mbarrier phase wait that never
// completes (one arrival of the two it expects, like a TMA transaction that never lands).
// It always releases itself: a CPU thread writes a host-mapped flag after RELEASE_S seconds,
// and the kernel also gives up at a deadline read from %globaltimer, so the GPU is never left
// wedged.
//
//   mbarrier_wedge launch RELEASE_S [DELAY_S]   after the wedge, keep launching on the same
//                                               stream: blocks once the queue is full
//   mbarrier_wedge sync   RELEASE_S [DELAY_S]   after the wedge, cudaStreamSynchronize
//   mbarrier_wedge lazy   RELEASE_S [DELAY_S]   after the wedge, the first launch of a kernel
//                                               never launched before: with lazy loading (the
//                                               default) the launch blocks loading it
//   mbarrier_wedge burst  RELEASE_S [DELAY_S]   as launch, but the wedged kernel comes right
//                                               after 3 other launches (no gap between them)
//   mbarrier_wedge first-sync RELEASE_S [DELAY_S]   as launch, while a second thread ("syncer")
//                                               synchronizes the stream every 200 us from just
//                                               before the wedged kernel's first launch, which
//                                               loads its module (lazy loading) before its work
//                                               is queued (the race CI showed on 2026-12-07)
// DELAY_S (default 0) waits after CUDA initialisation, before the wedge, so a probe can
// attach first.
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "reproducer.cuh"

__global__ void attn_mbarrier_wedge_kernel(volatile int *release, unsigned long long budget_ns) {
    __shared__ __align__(8) unsigned long long bar;
    unsigned addr = (unsigned)__cvta_generic_to_shared(&bar);
    if (threadIdx.x == 0) asm volatile("mbarrier.init.shared::cta.b64 [%0], 2;" ::"r"(addr));
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long state;  // the arrival's phase token; the wait below uses parity
        asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1];" : "=l"(state) : "r"(addr));
        (void)state;
        unsigned long long deadline = globaltimer() + budget_ns;
        unsigned done = 0;
        while (!done) {
            asm volatile(
                "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;"
                " selp.u32 %0, 1, 0, p; }"
                : "=r"(done)
                : "r"(addr));
            if (*release || globaltimer() > deadline) break;
        }
    }
    __syncthreads();
}

__global__ void decode_step_kernel(float *x) {
    if (x) x[threadIdx.x] += 1.0f;
}

__global__ void late_loaded_kernel(float *x) {
    if (x) x[threadIdx.x] -= 1.0f;
}

static volatile int *flag;
static double release_s;
static volatile int launching_done;
static cudaStream_t synced_stream;

// first-sync: synchronizes the stream over and over until the launcher is done (blocks behind
// the wedge once it is queued).
static void *sync_loop(void *) {
    pthread_setname_np(pthread_self(), "syncer");
    while (!launching_done) {
        cudaStreamSynchronize(synced_stream);
        usleep(200);
    }
    return NULL;
}

static void *releaser(void *) {
    usleep((useconds_t)(release_s * 1e6));
    *flag = 1;  // a plain CPU store to host-mapped memory ends the spin
    __sync_synchronize();
    fprintf(stderr, "mbarrier_wedge: released\n");
    return NULL;
}

static double now_s() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s launch|sync|lazy|burst|first-sync RELEASE_S [DELAY_S]\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    release_s = atof(argv[2]);
    double delay_s = argc > 3 ? atof(argv[3]) : 0;
    pthread_setname_np(pthread_self(), strcmp(mode, "sync") ? "launcher" : "syncer");
    if (strcmp(mode, "launch") && strcmp(mode, "sync") && strcmp(mode, "lazy") && strcmp(mode, "burst") &&
        strcmp(mode, "first-sync")) {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    // Initialise CUDA first (the runtime loads libcuda now), then wait: a probe attached
    // during the delay sees the kernels looked up and every call begin.
    CHECK(cudaSetDeviceFlags(cudaDeviceMapHost));
    CHECK(cudaFree(0));
    if (delay_s > 0) usleep((useconds_t)(delay_s * 1e6));

    int *host_flag, *dev_flag;
    CHECK(cudaHostAlloc(&host_flag, sizeof(int), cudaHostAllocMapped));
    *host_flag = 0;
    flag = host_flag;
    CHECK(cudaHostGetDevicePointer(&dev_flag, host_flag, 0));
    float *x;
    CHECK(cudaMalloc(&x, 1024 * sizeof(float)));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int i = 0; i < 10; i++) decode_step_kernel<<<1, 32, 0, s>>>(x);
    CHECK(cudaStreamSynchronize(s));

    pthread_t t;
    pthread_create(&t, NULL, releaser, NULL);
    if (!strcmp(mode, "burst"))
        for (int i = 0; i < 3; i++) decode_step_kernel<<<4, 32, 0, s>>>(x);
    pthread_t syncer{};
    int first_sync = !strcmp(mode, "first-sync");
    if (first_sync) {
        synced_stream = s;
        pthread_create(&syncer, NULL, sync_loop, NULL);
        usleep(2000);  // the syncer is synchronizing (an empty stream: returns at once)
    }
    double t0 = now_s();
    unsigned long long budget_ns = (unsigned long long)((release_s + 20) * 1e9);
    attn_mbarrier_wedge_kernel<<<dim3(132, 1, 1), dim3(128, 1, 1), 0, s>>>(dev_flag, budget_ns);
    CHECK(cudaGetLastError());
    // The kernel's first launch: under lazy loading it loads the module first (how long a
    // synchronize from another thread can return without waiting for it).
    fprintf(stderr, "mbarrier_wedge: pid %d wedged at %.3f (mode %s; its first launch call took %.0f us)\n",
            getpid(), t0, mode, (now_s() - t0) * 1e6);
    if (!strcmp(mode, "launch") || !strcmp(mode, "burst") || first_sync) {
        for (int i = 0; i < 3000; i++) decode_step_kernel<<<2, 64, 0, s>>>(x);
    }
    if (!strcmp(mode, "lazy")) {
        usleep(200000);
        late_loaded_kernel<<<1, 32, 0, s>>>(x);
        CHECK(cudaGetLastError());
    }
    CHECK(cudaStreamSynchronize(s));
    if (first_sync) {
        launching_done = 1;
        pthread_join(syncer, NULL);
    }
    fprintf(stderr, "mbarrier_wedge: done after %.2f s\n", now_s() - t0);
    pthread_join(t, NULL);
    return 0;
}
