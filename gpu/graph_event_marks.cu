// Event-record nodes in a graph's chain as progress marks (issue 30): what they cost a replay,
// and what a host thread can read from them while a node of the graph is stuck.
//
// Leaf writes (the shim's graph marks) cost a decode-shaped chain +0.9% and PyTorch's decode
// graph +4.8% a replay on an H100 (BENCHMARKS.md, "Graph marks"); an event record on a stream
// costs ~0 GPU time (mark_bubble.cu). Whether one *in* a graph's chain does too, and whether
// cuEventQuery can read a stuck replay's position, is what this measures.
//
//   graph_event_marks cost NODES PAIRS SPREAD  a chain of NODES kernels (SPREAD: decode =
//                                              2-20 us, short = 1-4 us, tiny = empty),
//                                              captured without marks and with an external
//                                              event record after every 1st/4th/16th kernel;
//                                              each variant timed against none in PAIRS
//                                              neighbouring pairs of 4 replays, random order.
//   graph_event_marks wedge RELEASE_S          a chain of 24 with an event after every
//                                              kernel, node 13 stuck: what cuEventQuery says
//                                              of each event (one replay in flight; a second
//                                              replay queued behind it; the host filling the
//                                              queue) and how long a query takes meanwhile.
//
// Always releases itself: a CPU thread writes the flag after RELEASE_S seconds and the
// spinning kernel gives up at a deadline read from %globaltimer.
#include <cuda.h>
#include <cuda_runtime.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "reproducer.cuh"

__global__ void spin_kernel(float *x, unsigned ns) {
    unsigned long long end = globaltimer() + ns;
    while (globaltimer() < end) {
    }
    x[threadIdx.x] += 1.0f;
}

__global__ void stuck_kernel(volatile int *release, float *x, unsigned long long budget_ns) {
    unsigned long long deadline = globaltimer() + budget_ns;
    while (*release == 0 && globaltimer() < deadline) {
    }
    x[threadIdx.x] += 1.0f;
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
    printf("  %-40s median %+6.2f%%  mean %+6.2f%% ± %.2f%%  q1 %+.2f%% q3 %+.2f%%  (%zu pairs)\n",
           what, 100 * v[v.size() / 2], 100 * mean, 100 * half, 100 * v[v.size() / 4],
           100 * v[3 * v.size() / 4], v.size());
}

static unsigned kernel_ns(const char *spread, int i) {
    unsigned h = (unsigned)i * 2654435761u;
    if (strcmp(spread, "decode") == 0) return 2000 + h % 18001u;
    if (strcmp(spread, "short") == 0) return 1000 + h % 3001u;
    return 0;
}

// A chain of `nodes` kernels captured on `s`, an external event record after every `every`th
// (0: none). The events are created here and leaked (the process is short).
static cudaGraphExec_t chain(cudaStream_t s, float *x, int nodes, const char *spread, int every,
                             std::vector<cudaEvent_t> *events) {
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < nodes; i++) {
        spin_kernel<<<1, 32, 0, s>>>(x, kernel_ns(spread, i));
        if (every > 0 && (i % every == every - 1 || i == nodes - 1)) {
            cudaEvent_t e;
            CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
            CHECK(cudaEventRecordWithFlags(e, s, cudaEventRecordExternal));
            if (events) events->push_back(e);
        }
    }
    CHECK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    return exec;
}

// The same chain without events, with a leaf write (a batch mem-op node, write-32 with the
// memory barrier: what the shim's graph marks add) after every `every`th kernel: the price
// to beat, measured in the same process.
static cudaGraphExec_t chain_with_leaf_writes(cudaStream_t s, float *x, int nodes,
                                              const char *spread, int every) {
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < nodes; i++) spin_kernel<<<1, 32, 0, s>>>(x, kernel_ns(spread, i));
    CHECK(cudaStreamEndCapture(s, &g));
    size_t n = 0;
    CHECK(cudaGraphGetNodes(g, NULL, &n));
    std::vector<cudaGraphNode_t> kernels(n);
    CHECK(cudaGraphGetNodes(g, kernels.data(), &n));
    unsigned *words;
    CHECK(cudaHostAlloc((void **)&words, 4 * n, cudaHostAllocMapped));
    CUdeviceptr d;
    if (cuMemHostGetDevicePointer(&d, words, 0) != CUDA_SUCCESS) exit(1);
    CUcontext ctx;
    cuCtxGetCurrent(&ctx);
    // A captured chain's nodes come back in capture order (checked: each one's dependency is
    // the one before it).
    for (size_t i = 0; i < n; i++) {
        if (!(i % every == (size_t)every - 1 || i == n - 1)) continue;
        CUstreamBatchMemOpParams op;
        memset(&op, 0, sizeof op);
        op.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
        op.writeValue.address = d + 4 * i;
        op.writeValue.value = 1;
        CUDA_BATCH_MEM_OP_NODE_PARAMS p;
        memset(&p, 0, sizeof p);
        p.ctx = ctx;
        p.count = 1;
        p.paramArray = &op;
        CUgraphNode leaf;
        CUgraphNode dep = (CUgraphNode)kernels[i];
        CUresult r = cuGraphAddBatchMemOpNode(&leaf, (CUgraph)g, &dep, 1, &p);
        if (r != CUDA_SUCCESS) {
            fprintf(stderr, "cuGraphAddBatchMemOpNode: %d\n", (int)r);
            exit(1);
        }
    }
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    return exec;
}

static int cost(int nodes, int pairs, const char *spread) {
    float *x;
    CHECK(cudaMalloc(&x, 64 * sizeof(float)));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    double total = 0;
    for (int i = 0; i < nodes; i++) total += kernel_ns(spread, i);
    printf("graph_event_marks cost: a chain of %d kernels, %.1f us each on average (%s)\n", nodes,
           total / nodes / 1e3, spread);
    // The last variant: leaf writes every 4th (no events).
    const int every[] = {1, 4, 16, 4};
    const int nv = 4;
    cudaGraphExec_t plain = chain(s, x, nodes, spread, 0, NULL), marked[nv];
    std::vector<cudaEvent_t> evs[nv];
    for (int v = 0; v < nv - 1; v++) marked[v] = chain(s, x, nodes, spread, every[v], &evs[v]);
    marked[nv - 1] = chain_with_leaf_writes(s, x, nodes, spread, 4);
    for (int w = 0; w < 20; w++) {
        CHECK(cudaGraphLaunch(plain, s));
        for (int v = 0; v < nv; v++) CHECK(cudaGraphLaunch(marked[v], s));
    }
    CHECK(cudaStreamSynchronize(s));
    // Replay time of the plain graph, for the per-mark figure.
    double t0 = now_s();
    for (int r = 0; r < 40; r++) CHECK(cudaGraphLaunch(plain, s));
    CHECK(cudaStreamSynchronize(s));
    double replay = (now_s() - t0) / 40;
    printf("  plain replay %.1f us\n", replay * 1e6);
    std::vector<double> c[nv];
    srand(7);
    for (int p = 0; p < pairs; p++)
        for (int v = 0; v < nv; v++) {
            double t[2];
            int first = rand() & 1;
            for (int k = 0; k < 2; k++) {
                int which = k ^ first;
                double a = now_s();
                for (int r = 0; r < 4; r++) CHECK(cudaGraphLaunch(which ? marked[v] : plain, s));
                CHECK(cudaStreamSynchronize(s));
                t[which] = now_s() - a;
            }
            c[v].push_back(t[1] / t[0] - 1);
        }
    for (int v = 0; v < nv; v++) {
        char what[64];
        size_t marks = v < nv - 1 ? evs[v].size() : (size_t)(nodes + 3) / 4;
        snprintf(what, sizeof what, "%s every %d (%zu marks)",
                 v < nv - 1 ? "event in the chain" : "leaf write", every[v], marks);
        stats(what, c[v]);
        std::vector<double> sorted = c[v];
        std::sort(sorted.begin(), sorted.end());
        printf("    ~%.3f us a mark\n", sorted[sorted.size() / 2] * replay * 1e6 / marks);
    }
    // What the host pays to read them: every event of the every-1 graph, queried, 100 times.
    double q0 = now_s();
    int n = 0;
    for (int r = 0; r < 100; r++)
        for (cudaEvent_t e : evs[0]) {
            cudaEventQuery(e);
            n++;
        }
    printf("  cudaEventQuery: %.0f ns a query (%d queries, nothing running)\n",
           (now_s() - q0) / n * 1e9, n);
    return 0;
}

static volatile int *flag;
static std::atomic<int> polling{0};
static double t_case;
static std::vector<cudaEvent_t> wedge_events;

static void *releaser(void *arg) {
    usleep((useconds_t)(*(double *)arg * 1e6));
    *flag = 1;
    return NULL;
}

// Reads every event once a poll until told to stop; prints each state string that changes and
// the slowest query.
static void *poller(void *) {
    char last[64] = "";
    double worst = 0;
    int polls = 0;
    while (polling.load()) {
        char now[64];
        size_t k = 0;
        for (cudaEvent_t e : wedge_events) {
            double a = now_s();
            cudaError_t r = cudaEventQuery(e);
            worst = std::max(worst, now_s() - a);
            now[k++] = r == cudaSuccess ? 'D' : r == cudaErrorNotReady ? '.' : '?';
        }
        now[k] = 0;
        polls++;
        if (strcmp(now, last) != 0) {
            printf("    %7.3f s  %s\n", now_s() - t_case, now);
            fflush(stdout);
            strcpy(last, now);
        }
        usleep(20000);
    }
    printf("    %d polls, slowest query %.3f ms\n", polls, worst * 1e3);
    return NULL;
}

static int wedge(double release_s) {
    int *h;
    CHECK(cudaHostAlloc((void **)&h, sizeof(int), cudaHostAllocMapped));
    *h = 1;
    flag = h;
    int *d_flag;
    CHECK(cudaHostGetDevicePointer((void **)&d_flag, h, 0));
    float *x;
    CHECK(cudaMalloc(&x, 64 * sizeof(float)));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    unsigned long long budget = (unsigned long long)((release_s + 20.0) * 1e9);
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < 24; i++) {
        if (i == 13)
            stuck_kernel<<<1, 32, 0, s>>>((volatile int *)d_flag, x, budget);
        else
            spin_kernel<<<1, 32, 0, s>>>(x, 3000);
        cudaEvent_t e;
        CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        CHECK(cudaEventRecordWithFlags(e, s, cudaEventRecordExternal));
        wedge_events.push_back(e);
    }
    CHECK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    for (int r = 0; r < 3; r++) CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    const char *cases[] = {"one replay in flight, the host in cudaStreamSynchronize",
                           "a second replay of the exec queued behind it",
                           "the host filling the queue with 20,000 kernels behind it"};
    for (int c = 0; c < 3; c++) {
        printf("  case %d: %s (node 13 stuck; D = done, . = not ready)\n", c, cases[c]);
        *h = 0;
        t_case = now_s();
        pthread_t rt, pt;
        pthread_create(&rt, NULL, releaser, &release_s);
        CHECK(cudaGraphLaunch(exec, s));
        if (c == 1) CHECK(cudaGraphLaunch(exec, s));
        polling = 1;
        pthread_create(&pt, NULL, poller, NULL);
        if (c == 2) {
            double a = now_s();
            for (int k = 0; k < 20000; k++) spin_kernel<<<1, 32, 0, s>>>(x, 0);
            printf("    20,000 launches took %.3f s (blocked in a full queue)\n", now_s() - a);
        }
        CHECK(cudaStreamSynchronize(s));
        usleep(100000);
        polling = 0;
        pthread_join(pt, NULL);
        pthread_join(rt, NULL);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 5 && strcmp(argv[1], "cost") == 0)
        return cost(atoi(argv[2]), atoi(argv[3]), argv[4]);
    if (argc >= 3 && strcmp(argv[1], "wedge") == 0) return wedge(atof(argv[2]));
    fprintf(stderr, "usage: graph_event_marks cost NODES PAIRS decode|short|tiny | wedge RELEASE_S\n");
    return 2;
}
