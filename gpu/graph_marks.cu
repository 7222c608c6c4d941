// The shim's graph marks on the GPU (issue 30): a captured CUDA graph whose node at AT spins,
// named in the default mode; the graph's output with and without marks; the replay and
// instantiation price of the marks, measured in one process.
//
//   graph_marks wedge SHAPE AT RELEASE_S   SHAPE chain (24 kernel nodes) or branches (a root,
//                                          two branches of 8 captured on two streams, a
//                                          join); node AT (capture order, from 0) is
//                                          graph_stuck_kernel, which spins on a host-mapped
//                                          flag on the 4th replay (3 healthy replays first).
//                                          AT -1: no node spins. Prints the output's checksum.
//   graph_marks cost NODES PAIRS [tiny]     a chain of NODES spinning kernels of 2-20 us
//                                          (~9 us mean: a decode graph's shape; `tiny`: no
//                                          spin, a launch-bound chain), instantiated without
//                                          graph marks and with each variant of them (the
//                                          shim's switch, WEDGEPROBE_SHIM_MEASURE=toggle), each
//                                          variant timed against none in PAIRS neighbouring
//                                          pairs of 4 replays in a random order; and 20
//                                          instantiations with and without, alternated.
//
// Always releases itself: a CPU thread writes the flag after RELEASE_S seconds and the
// spinning kernel gives up at a deadline read from %globaltimer.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "reproducer.cuh"

__global__ void graph_work_kernel(float *x, int i) {
    x[threadIdx.x] = x[threadIdx.x] * 0.5f + (float)(i + threadIdx.x);
}

__global__ void graph_stuck_kernel(volatile int *release, float *x, int i,
                                   unsigned long long budget_ns) {
    unsigned long long deadline = globaltimer() + budget_ns;
    while (*release == 0 && globaltimer() < deadline) {
    }
    x[threadIdx.x] = x[threadIdx.x] * 0.5f + (float)(i + threadIdx.x);
}

__global__ void graph_spin_kernel(float *x, unsigned ns) {
    unsigned long long end = globaltimer() + ns;
    while (globaltimer() < end) {
    }
    x[threadIdx.x] += 1.0f;
}

static volatile int *flag;
static double release_s;

static void *releaser(void *) {
    usleep((useconds_t)(release_s * 1e6));
    *flag = 1;
    fprintf(stderr, "graph_marks: released\n");
    return NULL;
}

static void node(cudaStream_t s, int i, int at, float *x, int *d_flag, unsigned long long budget) {
    // The block tells the nodes apart in the report: node i runs 32 + i threads.
    if (i == at)
        graph_stuck_kernel<<<1, 32, 0, s>>>((volatile int *)d_flag, x, i, budget);
    else
        graph_work_kernel<<<1, 32 + i, 0, s>>>(x, i);
}

static int wedge(const char *shape, int at) {
    int *h;
    CHECK(cudaHostAlloc((void **)&h, sizeof(int), cudaHostAllocMapped));
    *h = 1;
    flag = h;
    int *d_flag;
    CHECK(cudaHostGetDevicePointer((void **)&d_flag, h, 0));
    float *x, *y;
    CHECK(cudaMalloc(&x, 64 * sizeof(float)));
    CHECK(cudaMalloc(&y, 64 * sizeof(float)));
    CHECK(cudaMemset(x, 0, 64 * sizeof(float)));
    CHECK(cudaMemset(y, 0, 64 * sizeof(float)));
    cudaStream_t s, side;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    unsigned long long budget = (unsigned long long)((release_s + 20.0) * 1e9);
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    int i = 0;
    if (strcmp(shape, "branches") == 0) {
        cudaEvent_t fork, join;
        CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
        CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
        node(s, i++, at, x, d_flag, budget);
        CHECK(cudaEventRecord(fork, s));
        CHECK(cudaStreamWaitEvent(side, fork, 0));
        for (int k = 0; k < 8; k++) node(s, i++, at, x, d_flag, budget);
        for (int k = 0; k < 8; k++) node(side, i++, at, y, d_flag, budget);
        CHECK(cudaEventRecord(join, side));
        CHECK(cudaStreamWaitEvent(s, join, 0));
        node(s, i++, at, x, d_flag, budget);
    } else {
        for (int k = 0; k < 24; k++) node(s, i++, at, x, d_flag, budget);
    }
    CHECK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    for (int r = 0; r < 3; r++) CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    pthread_t t;
    if (at >= 0) {
        *h = 0;
        pthread_create(&t, NULL, releaser, NULL);
        fprintf(stderr, "graph_marks: %s graph, node %d stuck for %.0f s\n", shape, at, release_s);
    }
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    float out[128];
    CHECK(cudaMemcpy(out, x, 64 * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(out + 64, y, 64 * sizeof(float), cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int k = 0; k < 128; k++) sum += out[k] * (k + 1);
    printf("graph_marks: %s output checksum %.6f\n", shape, sum);
    if (at >= 0) pthread_join(t, NULL);
    return 0;
}

typedef int (*graph_marks_fn)(int);

static graph_marks_fn shim_switch() {
    const char *path = getenv("CUDA_INJECTION64_PATH");
    void *lib = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    return lib ? (graph_marks_fn)dlsym(lib, "wedgeprobe_shim_graph_marks") : NULL;
}

static double now_s() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void stats(const char *what, std::vector<double> v) {
    std::sort(v.begin(), v.end());
    double mean = 0, var = 0;
    for (double c : v) mean += c;
    mean /= v.size();
    for (double c : v) var += (c - mean) * (c - mean);
    double half = v.size() > 1 ? 1.96 * sqrt(var / (v.size() - 1)) / sqrt((double)v.size()) : 0;
    printf("  %-44s median %+6.2f%%  mean %+6.2f%% ± %.2f%%  q1 %+.2f%% q3 %+.2f%%  (%zu pairs)\n",
           what, 100 * v[v.size() / 2], 100 * mean, 100 * half, 100 * v[v.size() / 4],
           100 * v[3 * v.size() / 4], v.size());
}

static int cost(int nodes, int pairs, int tiny) {
    CHECK(cudaFree(0));  // the driver loads the shim (CUDA_INJECTION64_PATH) as CUDA starts
    graph_marks_fn marks = shim_switch();
    if (!marks || marks(4) < 0) {
        fprintf(stderr, "graph_marks cost: the shim's graph-marks switch is not there "
                        "(CUDA_INJECTION64_PATH and WEDGEPROBE_SHIM_MEASURE=toggle)\n");
        return 2;
    }
    float *x;
    CHECK(cudaMalloc(&x, 64 * sizeof(float)));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    double total_ns = 0;
    for (int i = 0; i < nodes; i++) {
        // 2-20 us, a fixed pseudo-random spread (a decode layer's GEMMs, norms, tiny ops).
        unsigned ns = tiny ? 0 : 2000 + (unsigned)((i * 2654435761u) % 18001u);
        total_ns += ns;
        graph_spin_kernel<<<1, 32, 0, s>>>(x, ns);
    }
    CHECK(cudaStreamEndCapture(s, &g));
    printf("graph_marks cost: a chain of %d kernels, %.1f us each on average\n", nodes,
           total_ns / nodes / 1e3);
    // Instantiation time, with and without marks, alternated.
    std::vector<double> inst[2];
    for (int r = 0; r < 20; r++)
        for (int m = 0; m < 2; m++) {
            marks(m ? 4 : 0);
            cudaGraphExec_t e;
            double t0 = now_s();
            CHECK(cudaGraphInstantiate(&e, g, 0));
            inst[m].push_back(now_s() - t0);
            CHECK(cudaGraphExecDestroy(e));
        }
    for (int m = 0; m < 2; m++) {
        std::sort(inst[m].begin(), inst[m].end());
        printf("  instantiate %s: median %.1f us (min %.1f, max %.1f; 20 each)\n",
               m ? "with marks (every 4th)" : "without marks", inst[m][10] * 1e6,
               inst[m][0] * 1e6, inst[m][19] * 1e6);
    }
    // The switch's value: kernels a mark covers | marks::graph::SHAPE_* (256: the reset in the
    // chain before the roots, 512: no reset, 1024: no leaf writes, 4096: memset leaves,
    // 8192: event-record leaves; the driver refused 2048, leaf writes without the memory
    // barrier, on the H100 of 2026-12-07).
    const struct { const char *what; int code; } variants[] = {
        {"default: leaf every 4th, reset beside", 4},
        {"leaf every 4th, reset in the chain", 4 | 256},
        {"leaf every 4th, no reset", 4 | 512},
        {"reset beside only", 4 | 1024},
        {"reset in the chain only", 4 | 256 | 1024},
        {"leaf after every kernel, reset beside", 1},
        {"leaf every 8th, reset beside", 8},
        {"memset leaf every 4th (price only)", 4 | 4096},
        {"event-record leaf every 4th (price only)", 4 | 8192},
        {"event-record leaf after every kernel (price only)", 1 | 8192},
    };
    const int nv = sizeof variants / sizeof variants[0];
    cudaGraphExec_t plain, marked[nv];
    marks(0);
    CHECK(cudaGraphInstantiate(&plain, g, 0));
    for (int v = 0; v < nv; v++) {
        marks(variants[v].code);
        CHECK(cudaGraphInstantiate(&marked[v], g, 0));
    }
    marks(4);
    for (int w = 0; w < 20; w++) {
        CHECK(cudaGraphLaunch(plain, s));
        for (int v = 0; v < nv; v++) CHECK(cudaGraphLaunch(marked[v], s));
    }
    CHECK(cudaStreamSynchronize(s));
    std::vector<double> c[nv];
    srand(7);
    for (int p = 0; p < pairs; p++) {
        for (int v = 0; v < nv; v++) {
            double t[2];
            int first = rand() & 1;
            for (int k = 0; k < 2; k++) {
                int which = k ^ first;  // 0: without marks, 1: with
                double t0 = now_s();
                for (int r = 0; r < 4; r++) CHECK(cudaGraphLaunch(which ? marked[v] : plain, s));
                CHECK(cudaStreamSynchronize(s));
                t[which] = now_s() - t0;
            }
            c[v].push_back(t[1] / t[0] - 1);
        }
    }
    for (int v = 0; v < nv; v++) stats(variants[v].what, c[v]);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 5 && strcmp(argv[1], "wedge") == 0) {
        release_s = atof(argv[4]);
        return wedge(argv[2], atoi(argv[3]));
    }
    if (argc >= 4 && strcmp(argv[1], "cost") == 0)
        return cost(atoi(argv[2]), atoi(argv[3]), argc > 4 && strcmp(argv[4], "tiny") == 0);
    fprintf(stderr, "usage: graph_marks wedge chain|branches AT RELEASE_S | cost NODES PAIRS [tiny]\n");
    return 2;
}
