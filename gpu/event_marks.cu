// A lead for cheaper marks: on the H200 `cuEventRecord` cost the launching thread
// ~0.14 µs against 1.85 µs for the `cuStreamWriteValue64` a mark is today (gpu/hook_cost.cu,
// BENCHMARKS.md, the recorder's price, 2026-12-01). Events would move progress reading to the flush thread
// (`cuEventQuery`, ~1.3 µs). Before building on that, this measures what the design depends on:
//  1. while a kernel is stuck and the launching thread is blocked in a full queue behind it,
//     does `cuEventQuery` from another thread return at once, with the right answers (events
//     recorded before the stuck kernel done, those after it not ready)?
//  2. does a thread polling events slow a thread that launches?
//  3. which of the other calls the shim's flush thread makes wait behind that blocked
//     launcher: `cuEventCreate` (an event ring is created the first time a stream wants
//     one), `cuEventDestroy`, `cuCtxSetCurrent`, `cuStreamIsCapturing`, and a mark on
//     another stream (`cuEventRecord`, `cuStreamWriteValue64`). On the H200 (2026-12-01) a
//     burst wedge with event marks published no mark at all; the queries alone were fast
//     here, so the suspect is one of these. A call that waits returns at the release, so
//     its time says it (> 1 s: "waits behind the full queue").
// The stuck kernel is released by a CPU thread through pinned memory after 5 s, and gives up
// by itself after 12 s.
//   nvcc -O2 -arch=sm_90 -o event_marks gpu/event_marks.cu -lcuda -lpthread && ./event_marks
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "reproducer.cuh"

__global__ void empty_kernel() {}

__global__ void stuck_kernel(volatile int *release, unsigned long long deadline_ns) {
    unsigned long long t0 = globaltimer();
    while (*release == 0 && globaltimer() - t0 < deadline_ns) {
    }
}

static double now_ns() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

#define CU(x)                                                                     \
    do {                                                                          \
        CUresult r_ = (x);                                                        \
        if (r_ != CUDA_SUCCESS) {                                                 \
            fprintf(stderr, "%s:%d %s failed: %d\n", __FILE__, __LINE__, #x, r_); \
            exit(1);                                                              \
        }                                                                         \
    } while (0)

enum { BEFORE = 16, AFTER = 1024, LAUNCHES = 200000 };
static CUfunction empty_f;
static CUstream stream;
static CUevent after_ev[AFTER];
static volatile long launched_after = 0;
static volatile int stop_polling = 0;
static CUcontext ctx;

static void *launcher(void *) {
    cuCtxSetCurrent(ctx);
    for (int i = 0; i < LAUNCHES; i++) {
        CU(cuLaunchKernel(empty_f, 1, 1, 1, 1, 1, 1, 0, stream, NULL, NULL));
        CU(cuEventRecord(after_ev[i % AFTER], stream));
        launched_after = i + 1;
    }
    return NULL;
}

static void *poller(void *arg) {
    CUevent ev = *(CUevent *)arg;
    cuCtxSetCurrent(ctx);
    long n = 0;
    while (!stop_polling) {
        cuEventQuery(ev);
        n++;
    }
    return (void *)n;
}

static void *releaser(void *arg) {
    sleep(5);
    *(volatile int *)arg = 1;
    return NULL;
}

int main() {
    CHECK(cudaFree(0));
    CU(cuCtxGetCurrent(&ctx));
    CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    cudaFunction_t rf;
    CHECK(cudaGetFuncBySymbol(&rf, (const void *)empty_kernel));
    empty_f = (CUfunction)rf;
    int *release;
    CHECK(cudaHostAlloc(&release, sizeof(int), cudaHostAllocMapped));
    *release = 0;
    CUevent before_ev[BEFORE], stuck_after;
    for (int i = 0; i < BEFORE; i++) CU(cuEventCreate(&before_ev[i], CU_EVENT_DISABLE_TIMING));
    for (int i = 0; i < AFTER; i++) CU(cuEventCreate(&after_ev[i], CU_EVENT_DISABLE_TIMING));
    CU(cuEventCreate(&stuck_after, CU_EVENT_DISABLE_TIMING));

    // 2. Polling beside launching, queue drained every 1000 (before anything is stuck).
    const int n = 200000;
    for (int round = 0; round < 2; round++) {
        for (int poll = 0; poll < 2; poll++) {
            pthread_t p;
            stop_polling = 0;
            if (poll) pthread_create(&p, NULL, poller, &before_ev[0]);
            double t0 = now_ns();
            for (int i = 0; i < n; i++) {
                CU(cuLaunchKernel(empty_f, 1, 1, 1, 1, 1, 1, 0, stream, NULL, NULL));
                if (i % 8 == 7) CU(cuEventRecord(before_ev[0], stream));
                if (i % 1000 == 999) CU(cuStreamSynchronize(stream));
            }
            CU(cuStreamSynchronize(stream));
            double per = (now_ns() - t0) / n;
            long polls = 0;
            if (poll) {
                stop_polling = 1;
                void *r;
                pthread_join(p, &r);
                polls = (long)r;
            }
            printf("round %d: launch + event every 8, %s: %.1f ns/launch%s", round,
                   poll ? "another thread polling cuEventQuery" : "no poller", per,
                   poll ? "" : "\n");
            if (poll) printf(" (%ld queries, %.0f ns each)\n", polls, (now_ns() - t0) / polls);
        }
    }

    // 1. A stuck kernel with events before and after it, and a full queue behind it.
    for (int i = 0; i < BEFORE; i++) {
        CU(cuLaunchKernel(empty_f, 1, 1, 1, 1, 1, 1, 0, stream, NULL, NULL));
        CU(cuEventRecord(before_ev[i], stream));
    }
    stuck_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(release, 12000000000ull);
    CHECK(cudaGetLastError());
    CU(cuEventRecord(stuck_after, stream));
    pthread_t l, r;
    pthread_create(&l, NULL, launcher, NULL);
    pthread_create(&r, NULL, releaser, release);
    usleep(1500000);  // the launcher fills the queue meanwhile
    long blocked_at = launched_after;
    double worst = 0;
    int done_before = 0, ready_after = 0;
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < BEFORE; i++) {
            double t0 = now_ns();
            CUresult q = cuEventQuery(before_ev[i]);
            double dt = now_ns() - t0;
            worst = dt > worst ? dt : worst;
            done_before += q == CUDA_SUCCESS;
        }
        double t0 = now_ns();
        CUresult q = cuEventQuery(stuck_after);
        double dt = now_ns() - t0;
        worst = dt > worst ? dt : worst;
        ready_after += q == CUDA_SUCCESS;
        for (long i = 0; i < launched_after && i < AFTER; i += 16) {
            t0 = now_ns();
            q = cuEventQuery(after_ev[i]);
            dt = now_ns() - t0;
            worst = dt > worst ? dt : worst;
            ready_after += q == CUDA_SUCCESS;
        }
        usleep(200000);
    }
    printf("stuck: launcher blocked after %ld launches (still %ld 1.5 s later: %s); "
           "before-events done %d/%d; after-events ready %d (want 0); slowest cuEventQuery "
           "%.1f µs\n",
           blocked_at, (long)launched_after,
           launched_after == blocked_at ? "blocked in a full queue" : "NOT blocked",
           done_before, 3 * BEFORE, ready_after, worst / 1e3);
    // 3. The flush thread's other calls, one at a time, the launcher still blocked (~2.2 s
    // into the wedge; the release comes at 5 s).
    CUstream other;
    CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    CUdeviceptr word;
    CU(cuMemAlloc(&word, 8));
    CUevent made[64];
    struct { const char *what; int k; } calls[] = {
        // Creation first: on 2026-12-07 (H200) the launcher moved on during the mark on
        // another stream, so what came after it was not measured against a blocked launch.
        {"cuCtxSetCurrent", 0},          {"cuStreamIsCapturing (stuck stream)", 1},
        {"cuEventQuery (stuck stream)", 2}, {"cuEventCreate x64", 5},
        {"cuEventDestroy x64", 6},       {"cuEventRecord (another stream)", 3},
        {"cuStreamWriteValue64 (another stream)", 4},
    };
    for (unsigned c = 0; c < sizeof calls / sizeof calls[0]; c++) {
        long before_n = launched_after;
        double t0 = now_ns();
        CUresult q = CUDA_SUCCESS;
        CUstreamCaptureStatus cs;
        switch (calls[c].k) {
        case 0: q = cuCtxSetCurrent(ctx); break;
        case 1: q = cuStreamIsCapturing(stream, &cs); break;
        case 2: q = cuEventQuery(stuck_after); break;
        case 3: q = cuEventRecord(before_ev[0], other); break;
        case 4: q = cuStreamWriteValue64(other, word, 1, 0); break;
        case 5:
            for (int i = 0; i < 64 && q == CUDA_SUCCESS; i++)
                q = cuEventCreate(&made[i], CU_EVENT_DISABLE_TIMING);
            break;
        case 6:
            for (int i = 0; i < 64 && q == CUDA_SUCCESS; i++) q = cuEventDestroy(made[i]);
            break;
        }
        double dt = (now_ns() - t0) / 1e3;
        printf("while blocked: %-40s %10.1f us  -> %d%s%s\n", calls[c].what, dt, (int)q,
               dt > 1e6 ? "  WAITS behind the full queue" : "",
               launched_after != before_n ? "  (the launcher moved: not blocked any more)" : "");
    }
    pthread_join(r, NULL);
    pthread_join(l, NULL);
    CHECK(cudaDeviceSynchronize());
    printf("released: every launch done, %ld after the stuck kernel\n", (long)launched_after);
    return 0;
}
