// A CUDA graph whose middle kernel node is stuck: three kernel nodes in a chain —
// graph_pre_kernel, graph_stuck_middle_kernel (spins on a host-mapped flag), graph_post_kernel
// — launched as one graph; the main thread then synchronizes. It always releases itself: a
// CPU thread writes the flag after RELEASE_S seconds, and the kernel gives up at a deadline
// read from %globaltimer.
//
//   graph_wedge capture  RELEASE_S   the graph comes from stream capture (what PyTorch,
//                                    vLLM, SGLang and TensorRT-LLM do)
//   graph_wedge explicit RELEASE_S   the graph is built with cudaGraphAddKernelNode
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "reproducer.cuh"

__global__ void graph_pre_kernel(float *x) { x[threadIdx.x] += 1.0f; }

__global__ void graph_stuck_middle_kernel(volatile int *release, float *x,
                                          unsigned long long budget_ns) {
    unsigned long long deadline = globaltimer() + budget_ns;
    while (*release == 0 && globaltimer() < deadline) {
    }
    x[threadIdx.x] *= 2.0f;
}

__global__ void graph_post_kernel(float *x) { x[threadIdx.x] -= 1.0f; }

static volatile int *flag;
static double release_s;

static void *releaser(void *) {
    usleep((useconds_t)(release_s * 1e6));
    *flag = 1;
    fprintf(stderr, "graph_wedge: released\n");
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: graph_wedge capture|explicit RELEASE_S\n");
        return 2;
    }
    int capture = strcmp(argv[1], "capture") == 0;
    release_s = atof(argv[2]);
    int *h;
    CHECK(cudaHostAlloc((void **)&h, sizeof(int), cudaHostAllocMapped));
    *h = 0;
    flag = h;
    int *d_flag;
    CHECK(cudaHostGetDevicePointer((void **)&d_flag, h, 0));
    float *x;
    CHECK(cudaMalloc(&x, 32 * sizeof(float)));
    CHECK(cudaMemset(x, 0, 32 * sizeof(float)));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    unsigned long long budget = (unsigned long long)((release_s + 20.0) * 1e9);
    cudaGraph_t g;
    if (capture) {
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        graph_pre_kernel<<<1, 32, 0, s>>>(x);
        graph_stuck_middle_kernel<<<1, 32, 0, s>>>((volatile int *)d_flag, x, budget);
        graph_post_kernel<<<1, 32, 0, s>>>(x);
        CHECK(cudaStreamEndCapture(s, &g));
    } else {
        CHECK(cudaGraphCreate(&g, 0));
        cudaGraphNode_t a, b, c;
        cudaKernelNodeParams p;
        memset(&p, 0, sizeof p);
        p.gridDim = dim3(1);
        p.blockDim = dim3(32);
        void *args_pre[] = {&x};
        p.func = (void *)graph_pre_kernel;
        p.kernelParams = args_pre;
        CHECK(cudaGraphAddKernelNode(&a, g, NULL, 0, &p));
        void *args_mid[] = {&d_flag, &x, &budget};
        p.func = (void *)graph_stuck_middle_kernel;
        p.kernelParams = args_mid;
        CHECK(cudaGraphAddKernelNode(&b, g, &a, 1, &p));
        p.func = (void *)graph_post_kernel;
        p.kernelParams = args_pre;
        CHECK(cudaGraphAddKernelNode(&c, g, &b, 1, &p));
    }
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    // One healthy replay first (released flag), so the graph has completed once.
    *h = 1;
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    *h = 0;
    pthread_t t;
    pthread_create(&t, NULL, releaser, NULL);
    fprintf(stderr, "graph_wedge: %s graph launched, middle node stuck for %.0f s\n",
            capture ? "captured" : "explicit", release_s);
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    float out[32];
    CHECK(cudaMemcpy(out, x, sizeof out, cudaMemcpyDeviceToHost));
    printf("graph_wedge: done; x[0] = %.1f (expected 3.0)\n", out[0]);
    pthread_join(t, NULL);
    return 0;
}
