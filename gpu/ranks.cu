// The culprit rank on one GPU: several processes share the H200, one "rank" each. Every rank does some
// warm-up work, then the culprit rank (CULPRIT=1) launches a non-collective kernel that spins
// on a host flag (a wedged GEMM), and every other rank launches a "collective" kernel —
// named like NCCL's, `ncclDevKernel_AllReduce_Sum_f32_RING_LL` — that waits for a flag in
// shared memory which the culprit sets only once its own kernel has finished. So the peers
// wait in a collective for the culprit, as in production. Everything releases itself: the
// culprit's CPU thread releases its kernel after RELEASE_S, it then releases the peers, and
// every kernel also gives up at a %globaltimer deadline.
//   RANK=r CULPRIT=0|1 ranks RELEASE_S SHM_NAME
#include <cuda_runtime.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "reproducer.cuh"

__global__ void warmup_kernel(float *x) { x[threadIdx.x] += 1.0f; }

__global__ void gemm_stuck_kernel(volatile int *flag, float *x, unsigned long long budget_ns) {
    unsigned long long end = globaltimer() + budget_ns;
    while (*flag == 0 && globaltimer() < end) {
    }
    x[threadIdx.x] *= 2.0f;
}

extern "C" __global__ void ncclDevKernel_AllReduce_Sum_f32_RING_LL(volatile int *peer_flag, float *x,
                                                                   unsigned long long budget_ns) {
    unsigned long long end = globaltimer() + budget_ns;
    while (*peer_flag == 0 && globaltimer() < end) {
    }
    x[threadIdx.x] += 3.0f;
}

static volatile int *own_flag;
static double release_s;

static void *releaser(void *) {
    usleep((useconds_t)(release_s * 1e6));
    *own_flag = 1;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: RANK=r CULPRIT=0|1 ranks RELEASE_S SHM_NAME\n");
        return 2;
    }
    release_s = atof(argv[1]);
    int culprit = getenv("CULPRIT") && atoi(getenv("CULPRIT")) == 1;
    const char *rank = getenv("RANK") ? getenv("RANK") : "?";
    // The shared "peers may proceed" flag: a page of /dev/shm, mapped and registered.
    int fd = shm_open(argv[2], O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, 4096) != 0) { perror("shm"); return 1; }
    void *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (page == MAP_FAILED) { perror("mmap"); return 1; }
    CHECK(cudaSetDevice(0));
    CHECK(cudaHostRegister(page, 4096, cudaHostRegisterMapped));
    volatile int *peer_flag_h = (volatile int *)page;
    int *peer_flag_d;
    CHECK(cudaHostGetDevicePointer((void **)&peer_flag_d, page, 0));
    int *own_h;
    CHECK(cudaHostAlloc((void **)&own_h, sizeof(int), cudaHostAllocMapped));
    *own_h = 0;
    own_flag = own_h;
    int *own_d;
    CHECK(cudaHostGetDevicePointer((void **)&own_d, own_h, 0));
    float *x;
    CHECK(cudaMalloc(&x, 32 * sizeof(float)));
    CHECK(cudaMemset(x, 0, 32 * sizeof(float)));
    for (int i = 0; i < 100; i++) warmup_kernel<<<1, 32>>>(x);
    CHECK(cudaDeviceSynchronize());
    unsigned long long budget = (unsigned long long)((release_s + 30.0) * 1e9);
    fprintf(stderr, "ranks: rank %s pid %d %s\n", rank, getpid(), culprit ? "culprit: GEMM stuck" : "waiting in all-reduce");
    if (culprit) {
        pthread_t t;
        pthread_create(&t, NULL, releaser, NULL);
        usleep(200000);  // the culprit stops first
        gemm_stuck_kernel<<<1, 32>>>((volatile int *)own_d, x, budget);
        CHECK(cudaDeviceSynchronize());
        *peer_flag_h = 1;  // the collective can complete now
        pthread_join(t, NULL);
    } else {
        usleep(1200000);  // the peers reach the all-reduce later
        ncclDevKernel_AllReduce_Sum_f32_RING_LL<<<1, 32>>>((volatile int *)peer_flag_d, x, budget);
        CHECK(cudaDeviceSynchronize());
    }
    fprintf(stderr, "ranks: rank %s done\n", rank);
    CHECK(cudaHostUnregister(page));
    return 0;
}
