/*
 * A simulated libcuda.so.1, so the eBPF side and the whole pipeline are tested for real on
 * machines without a GPU.
 *
 * It exports the traced driver entry points with their real C signatures (x86-64 System V:
 * the probe reads launch dimensions and streams from the same registers and stack slots as on
 * the real driver) and behaves as measured on the H200 (notes/gpu-machine.md):
 *   - launches go into one bounded queue of 1021 entries drained in order by a "GPU" thread;
 *   - while the queue is full, a launch spins on sched_yield (≈72k yields/s on the H200);
 *   - synchronize busy-spins without yielding (100% CPU, zero sched_yield), unless
 *     SIMCUDA_BLOCKING_SYNC=1, which sleeps instead (cudaDeviceScheduleBlockingSync);
 *   - a kernel whose name contains "wedge" (or $SIMCUDA_WEDGE_KERNEL) never completes ("the
 *     switch that wedges it")
 *     until simcuda_release() is called or SIMCUDA_RELEASE_AFTER_S (default 10) seconds
 *     pass, so a test can never leave a process stuck forever.
 * Kernel durations: SIMCUDA_KERNEL_US (default 5); a name containing "long" runs
 * SIMCUDA_LONG_KERNEL_MS (default 3000) ms.
 * Like the real driver, it loads CUDA_INJECTION64_PATH at initialisation and calls its
 * InitializeInjection; the library may then subscribe (simcuda_subscribe) to the callbacks
 * CUPTI would make: API enter/exit with correlation ids, kernel completions.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_sim.h"

#define EXPORT __attribute__((visibility("default"), noinline))
#define QUEUE_CAP 1021
#define MAX_STREAMS 64

enum { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_NOT_FOUND = 500 };

struct sim_kernel {
    char name[512];
    uint64_t duration_ns;
    int wedges;
    uint64_t runs; /* the GPU thread's count of its runs */
    _Atomic int loaded; /* launched before (SIMCUDA_FIRST_LAUNCH_LOADS_MS) */
};
struct sim_node;

struct item {
    struct sim_kernel *k;
    uint64_t seq;
    uint64_t correlation;
    unsigned stream_id;
    _Atomic uint64_t *mark_addr; /* a stream-ordered write (cuStreamWriteValue64): k is mark_op */
    uint64_t mark_value;
    const struct sim_node *node; /* a graph node of a replay (sim_graph.c): k is its kernel or mark_op */
};

static const struct simcuda_callbacks *subscriber;
static _Atomic uint64_t next_correlation = 1;

EXPORT void simcuda_subscribe(const struct simcuda_callbacks *cb) { subscriber = cb; }

static uint64_t api_enter(unsigned api, const struct simcuda_launch *l) {
    if (!subscriber) return 0;
    uint64_t c = atomic_fetch_add(&next_correlation, 1);
    subscriber->api_enter(api, c, l);
    return c;
}

static void api_exit(unsigned api, uint64_t c) {
    if (subscriber) subscriber->api_exit(api, c);
}

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work = PTHREAD_COND_INITIALIZER;
static struct item queue[QUEUE_CAP];
static unsigned head, count;
static uint64_t next_seq = 1;                  /* under mu */
static _Atomic uint64_t completed_seq;          /* written by the GPU thread */
static struct { uintptr_t stream; uint64_t last_seq; } streams[MAX_STREAMS]; /* under mu */
static _Atomic int released;
static pthread_once_t started = PTHREAD_ONCE_INIT;
static uint64_t default_kernel_ns, long_kernel_ns, release_after_ns, wedge_on_run;
static int blocking_sync;
static struct sim_kernel graph_kernel = {"graph_launch", 5000, 0};
static struct sim_kernel mark_op = {"(stream write)", 0, 0};

static void run_node_ops(const struct sim_node *n); /* sim_graph.c */
static void log_kernel(const struct sim_kernel *k);

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t env_u64(const char *name, uint64_t dflt) {
    const char *v = getenv(name);
    return v && *v ? strtoull(v, NULL, 10) : dflt;
}

static void sleep_ns(uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    nanosleep(&ts, NULL);
}

/* The "GPU": executes queued kernels in order, one at a time. */
static void *gpu_main(void *arg) {
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&mu);
        while (count == 0) pthread_cond_wait(&work, &mu);
        struct item it = queue[head];
        pthread_mutex_unlock(&mu);
        uint64_t started = now_ns();
        /* SIMCUDA_WEDGE_ON_RUN=N: a wedging kernel wedges on its N-th run only (a graph
         * replayed healthy before the replay that wedges, and after); unset: every run. */
        int wedge_now = it.k->wedges && (++it.k->runs == wedge_on_run || !wedge_on_run);
        if (wedge_now) {
            uint64_t deadline = now_ns() + release_after_ns;
            while (!atomic_load(&released) && now_ns() < deadline) sleep_ns(1000000);
        } else if (it.k->duration_ns >= 50000) {
            sleep_ns(it.k->duration_ns);
        } else {
            uint64_t end = now_ns() + it.k->duration_ns;
            while (now_ns() < end) {
            }
        }
        if (it.mark_addr) atomic_store(it.mark_addr, it.mark_value);
        if (it.node) run_node_ops(it.node);
        if (it.k != &mark_op && it.k != &graph_kernel) log_kernel(it.k);
        pthread_mutex_lock(&mu);
        head = (head + 1) % QUEUE_CAP;
        count--;
        pthread_mutex_unlock(&mu);
        atomic_store(&completed_seq, it.seq);
        if (subscriber && it.correlation)
            subscriber->kernel_done(it.correlation, started, now_ns(), it.stream_id);
    }
    return NULL;
}

static void start_gpu(void) {
    /* SIMCUDA_INIT_DELAY_MS: the driver's initialisation takes this long before it loads the
     * injection library (PyTorch's CUDA initialisation took 10-17 s on the H200 VM). */
    sleep_ns(env_u64("SIMCUDA_INIT_DELAY_MS", 0) * 1000000ull);
    default_kernel_ns = env_u64("SIMCUDA_KERNEL_US", 5) * 1000;
    long_kernel_ns = env_u64("SIMCUDA_LONG_KERNEL_MS", 3000) * 1000000;
    release_after_ns = env_u64("SIMCUDA_RELEASE_AFTER_S", 10) * 1000000000ull;
    wedge_on_run = env_u64("SIMCUDA_WEDGE_ON_RUN", 0);
    blocking_sync = env_u64("SIMCUDA_BLOCKING_SYNC", 0) != 0;
    pthread_t t;
    pthread_create(&t, NULL, gpu_main, NULL);
    pthread_setname_np(t, "sim-gpu");
    pthread_detach(t);
    const char *inject = getenv("CUDA_INJECTION64_PATH");
    if (inject && *inject) {
        void *lib = dlopen(inject, RTLD_NOW | RTLD_LOCAL);
        int (*init)(void) = lib ? (int (*)(void))dlsym(lib, "InitializeInjection") : NULL;
        if (init) init();
        else fprintf(stderr, "simcuda: cannot load %s: %s\n", inject, dlerror());
    }
}

static unsigned stream_index(CUstream s) {
    uintptr_t key = (uintptr_t)s;
    for (unsigned i = 0; i < MAX_STREAMS; i++) {
        if (streams[i].stream == key || streams[i].last_seq == 0) {
            streams[i].stream = key;
            return i;
        }
    }
    return MAX_STREAMS - 1;
}

static uint64_t *stream_slot(CUstream s) { return &streams[stream_index(s)].last_seq; }

/* A launch waiting for room in the full queue holds a driver lock that some calls from other
 * threads take too:
 * SIMCUDA_EVENT_CREATE_BEHIND_FULL_QUEUE=1: cuEventCreate and cuEventDestroy — what the H200
 * showed (2026-12-07): with event marks, a stream's event ring wanted just as its launcher
 * filled the queue behind a stuck kernel was created only once the kernel was released, and
 * the shim's flush thread, which created it then, published nothing meanwhile.
 * SIMCUDA_EVENT_QUERY_BEHIND_FULL_QUEUE=1: cuEventQuery too — what was thought on 2026-12-01;
 * the H200 answered queries within 20 µs with the launcher blocked (gpu/event_marks.cu), but
 * the reader's guard against stale marks is tested with it. */
static pthread_mutex_t driver_lock = PTHREAD_MUTEX_INITIALIZER;
static int query_behind_full_queue(void) {
    static int v = -1;
    if (v < 0) v = getenv("SIMCUDA_EVENT_QUERY_BEHIND_FULL_QUEUE") != NULL;
    return v;
}
static int create_behind_full_queue(void) {
    static int v = -1;
    if (v < 0) v = getenv("SIMCUDA_EVENT_CREATE_BEHIND_FULL_QUEUE") != NULL;
    return v;
}
static void wait_behind_full_queue(void) {
    pthread_mutex_lock(&driver_lock);
    pthread_mutex_unlock(&driver_lock);
}

/* Queues `it` on stream `s` (its seq assigned here); while the queue is full, spins on
 * sched_yield as the real driver does. */
static uint64_t push(CUstream s, struct item it) {
    int holds_driver_lock = 0;
    pthread_mutex_lock(&mu);
    while (count == QUEUE_CAP) {
        pthread_mutex_unlock(&mu);
        if ((query_behind_full_queue() || create_behind_full_queue()) && !holds_driver_lock) {
            pthread_mutex_lock(&driver_lock);
            holds_driver_lock = 1;
        }
        sched_yield();
        pthread_mutex_lock(&mu);
    }
    it.seq = next_seq++;
    queue[(head + count) % QUEUE_CAP] = it;
    count++;
    *stream_slot(s) = it.seq;
    pthread_cond_signal(&work);
    pthread_mutex_unlock(&mu);
    if (holds_driver_lock) pthread_mutex_unlock(&driver_lock);
    return it.seq;
}

/* Enqueue; while the queue is full, spin on sched_yield as the real driver does. */
static int sim_device(void);

/* sim_graph.c: a launch into a stream being captured becomes a node of its graph. */
static int capture_add(CUstream s, struct sim_kernel *k, const unsigned grid[3], const unsigned block[3]);

static CUresult enqueue(unsigned api, struct sim_kernel *k, CUstream s, const unsigned grid[3],
                        const unsigned block[3]) {
    if (!k) return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&started, start_gpu);
    if (capture_add(s, k, grid, block)) {
        uint64_t corr = api_enter(api, NULL);
        api_exit(api, corr);
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&mu);
    unsigned sid = stream_index(s);
    pthread_mutex_unlock(&mu);
    struct simcuda_launch l = {k->name, (unsigned long long)(uintptr_t)s, sid, (unsigned)sim_device(),
                               {grid[0], grid[1], grid[2]}, {block[0], block[1], block[2]}};
    uint64_t corr = api_enter(api, &l);
    /* SIMCUDA_FIRST_LAUNCH_LOADS_MS=N: a kernel's first launch loads its module for N ms
     * before its work is queued, as CUDA's lazy loading (the default since 12.2) does: a
     * synchronize from another thread meanwhile returns without waiting for it. */
    static int64_t loads_ms = -1;
    if (loads_ms < 0) loads_ms = (int64_t)env_u64("SIMCUDA_FIRST_LAUNCH_LOADS_MS", 0);
    if (loads_ms > 0 && !atomic_exchange(&k->loaded, 1)) sleep_ns((uint64_t)loads_ms * 1000000ull);
    push(s, (struct item){k, 0, corr, sid, NULL, 0});
    api_exit(api, corr);
    return CUDA_SUCCESS;
}

/* Wait until `seq` completed: a busy spin without yields, or a sleep in blocking-sync mode. */
static CUresult wait_for(unsigned api, uint64_t seq) {
    uint64_t corr = api_enter(api, NULL);
    while (atomic_load(&completed_seq) < seq) {
        if (blocking_sync) sleep_ns(1000000);
        else __builtin_ia32_pause();
    }
    api_exit(api, corr);
    return CUDA_SUCCESS;
}

static uint64_t last_launched(CUstream s) {
    pthread_mutex_lock(&mu);
    uint64_t seq = s == (CUstream)-1 ? next_seq - 1 : *stream_slot(s);
    pthread_mutex_unlock(&mu);
    return seq;
}

EXPORT CUresult cuInit(unsigned flags) { (void)flags; pthread_once(&started, start_gpu); return 0; }
EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) { *d = ordinal; return 0; }
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    (void)d;
    pthread_once(&started, start_gpu);
    *c = (CUcontext)0x1;
    return 0;
}
EXPORT CUresult cuCtxCreate_v2(CUcontext *c, unsigned f, CUdevice d) { (void)f; (void)d; *c = (CUcontext)0x1; return 0; }
EXPORT CUresult cuStreamCreate(CUstream *s, unsigned flags) {
    (void)flags;
    *s = (CUstream)calloc(1, 64);
    return *s ? 0 : 2;
}

static struct sim_kernel *new_kernel(const char *name) {
    struct sim_kernel *k = calloc(1, sizeof *k);
    if (!k) return NULL;
    snprintf(k->name, sizeof k->name, "%s", name);
    /* SIMCUDA_WEDGE_KERNEL: the name substring that wedges (default "wedge"). */
    const char *w = getenv("SIMCUDA_WEDGE_KERNEL");
    k->wedges = strstr(name, w && *w ? w : "wedge") != NULL;
    k->duration_ns = strstr(name, "long") ? long_kernel_ns : default_kernel_ns;
    return k;
}

EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    (void)m;
    pthread_once(&started, start_gpu);
    *f = new_kernel(name);
    return *f ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
EXPORT CUresult cuLibraryGetKernel(CUkernel *k, CUlibrary l, const char *name) {
    return cuModuleGetFunction(k, l, name);
}
EXPORT CUresult cuKernelGetFunction(CUfunction *f, CUkernel k) { *f = k; return 0; }

#define DIMS(a, b, c) ((const unsigned[3]){a, b, c})

/* The launch entry points keep a frame-pointer prologue (push rbp; mov rbp,rsp; ...), as
 * libcuda's exported functions do, so the shim's launch hooks patch them here too. */
#define HOOKABLE __attribute__((noinline, optimize("no-omit-frame-pointer", "no-shrink-wrap")))

/* SIM_PROLOGUE=1..3 builds a driver whose launch entry points begin the way other driver
 * builds' do (tests/build.rs: OUT_DIR/simcuda/prologue-*): each exported entry is a thunk in
 * assembly that tail-jumps (stack arguments untouched) to the C body, renamed and hidden. */
#ifdef SIM_PROLOGUE
#define LAUNCH_EXPORT __attribute__((visibility("hidden"), noinline, used))
#define cuLaunchKernel sim_impl_cuLaunchKernel
#define cuLaunchKernel_ptsz sim_impl_cuLaunchKernel_ptsz
#define cuLaunchKernelEx sim_impl_cuLaunchKernelEx
#define cuLaunchKernelEx_ptsz sim_impl_cuLaunchKernelEx_ptsz
#define cuLaunchCooperativeKernel sim_impl_cuLaunchCooperativeKernel
#define cuLaunchCooperativeKernel_ptsz sim_impl_cuLaunchCooperativeKernel_ptsz
#define cuGraphLaunch sim_impl_cuGraphLaunch
#define cuGraphLaunch_ptsz sim_impl_cuGraphLaunch_ptsz
#define THUNK_HEAD(name) \
    ".globl " #name "\n.type " #name ",@function\n.p2align 4\n" #name ":\n"
#define THUNK_TAIL(name) ".size " #name ",.-" #name "\n"
#if SIM_PROLOGUE == 1
/* A CET build (-fcf-protection): endbr64 first, then a frame-pointer prologue. */
#define THUNK(name) THUNK_HEAD(name) \
    "endbr64\npush rbp\nmov rbp, rsp\npop rbp\njmp sim_impl_" #name "\n" THUNK_TAIL(name)
#elif SIM_PROLOGUE == 2
/* gcc -O2's small wrapper: sub rsp first, then a RIP-relative lea. */
#define THUNK(name) THUNK_HEAD(name) \
    "sub rsp, 8\nlea r11, [rip + sim_impl_" #name "]\nadd rsp, 8\njmp r11\n" THUNK_TAIL(name)
#else
/* A RIP-relative load first (a dispatch through a pointer), then a short conditional branch
 * among the instructions the jump covers. */
#define THUNK(name) THUNK_HEAD(name) \
    "mov rax, qword ptr [rip + sim_ptr_" #name "]\ntest rax, rax\nje 1f\njmp rax\n" \
    "1: mov eax, 1\nret\n" THUNK_TAIL(name) \
    ".pushsection .data.rel.ro\n.p2align 3\nsim_ptr_" #name ":\n.quad sim_impl_" #name \
    "\n.popsection\n"
#endif
#define ALL_THUNKS(T) T(cuLaunchKernel) T(cuLaunchKernel_ptsz) T(cuLaunchKernelEx) \
    T(cuLaunchKernelEx_ptsz) T(cuLaunchCooperativeKernel) T(cuLaunchCooperativeKernel_ptsz) \
    T(cuGraphLaunch) T(cuGraphLaunch_ptsz)
#else
#define LAUNCH_EXPORT EXPORT
#endif

EXPORT CUresult cuFuncGetName(const char **name, CUfunction f) {
    if (!name || !f) return CUDA_ERROR_INVALID_VALUE;
    *name = ((struct sim_kernel *)f)->name;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetCurrent(CUcontext *c) { *c = (CUcontext)0x1; return 0; }
/* The stream index the callbacks report as its id (what CUPTI's stream ids are to the shim). */
EXPORT unsigned simcuda_stream_id(CUstream s) {
    pthread_mutex_lock(&mu);
    unsigned sid = stream_index(s);
    pthread_mutex_unlock(&mu);
    return sid;
}

/* The stream's id (a CUDA 12 entry point the shim names streams by when CUPTI is not loaded). */
EXPORT CUresult cuStreamGetId(CUstream s, unsigned long long *id) {
    if (!id) return CUDA_ERROR_INVALID_VALUE;
    *id = simcuda_stream_id(s) + 1;
    return CUDA_SUCCESS;
}

LAUNCH_EXPORT HOOKABLE CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned shmem, CUstream s,
                               void **params, void **extra) {
    (void)shmem; (void)params; (void)extra;
    return enqueue(SIM_API_LAUNCH_KERNEL, f, s, DIMS(gx, gy, gz), DIMS(bx, by, bz));
}
LAUNCH_EXPORT HOOKABLE CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                    unsigned by, unsigned bz, unsigned shmem, CUstream s,
                                    void **params, void **extra) {
    (void)shmem; (void)params; (void)extra;
    return enqueue(SIM_API_LAUNCH_KERNEL + 1, f, s, DIMS(gx, gy, gz), DIMS(bx, by, bz));
}
LAUNCH_EXPORT HOOKABLE CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    (void)params; (void)extra;
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    return enqueue(SIM_API_LAUNCH_KERNEL_EX, f, c->hStream, DIMS(c->gridDimX, c->gridDimY, c->gridDimZ),
                   DIMS(c->blockDimX, c->blockDimY, c->blockDimZ));
}
LAUNCH_EXPORT HOOKABLE CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    (void)params; (void)extra;
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    return enqueue(SIM_API_LAUNCH_KERNEL_EX + 1, f, c->hStream, DIMS(c->gridDimX, c->gridDimY, c->gridDimZ),
                   DIMS(c->blockDimX, c->blockDimY, c->blockDimZ));
}
LAUNCH_EXPORT HOOKABLE CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                          unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                          CUstream s, void **params) {
    (void)shmem; (void)params;
    return enqueue(SIM_API_LAUNCH_COOPERATIVE, f, s, DIMS(gx, gy, gz), DIMS(bx, by, bz));
}
LAUNCH_EXPORT HOOKABLE CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy,
                                                        unsigned gz, unsigned bx, unsigned by,
                                                        unsigned bz, unsigned shmem, CUstream s,
                                                        void **params) {
    (void)shmem; (void)params;
    return enqueue(SIM_API_LAUNCH_COOPERATIVE + 1, f, s, DIMS(gx, gy, gz), DIMS(bx, by, bz));
}
static void push_replay(CUstream s, CUgraphExec g); /* sim_graph.c */

/* A graph launch: the exec's nodes (sim_graph.c; none for a handle it did not make), then the
 * launch's own completion. Inlined: a tail call to it would leave the entry points without the
 * frame-pointer prologue the launch hooks patch (the shim refuses an entry whose first
 * instruction writes an argument register). */
static inline __attribute__((always_inline)) CUresult graph_launch(unsigned api, CUgraphExec g, CUstream s) {
    pthread_once(&started, start_gpu);
    pthread_mutex_lock(&mu);
    unsigned sid = stream_index(s);
    pthread_mutex_unlock(&mu);
    struct simcuda_launch l = {graph_kernel.name, (unsigned long long)(uintptr_t)s, sid, (unsigned)sim_device(),
                               {1, 1, 1}, {1, 1, 1}};
    uint64_t corr = api_enter(api, &l);
    push_replay(s, g);
    push(s, (struct item){&graph_kernel, 0, corr, sid, NULL, 0, NULL});
    api_exit(api, corr);
    return CUDA_SUCCESS;
}
LAUNCH_EXPORT HOOKABLE CUresult cuGraphLaunch(CUgraphExec g, CUstream s) {
    return graph_launch(SIM_API_GRAPH_LAUNCH, g, s);
}
LAUNCH_EXPORT HOOKABLE CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) {
    return graph_launch(SIM_API_GRAPH_LAUNCH + 1, g, s);
}

#ifdef SIM_PROLOGUE
#undef cuLaunchKernel
#undef cuLaunchKernel_ptsz
#undef cuLaunchKernelEx
#undef cuLaunchKernelEx_ptsz
#undef cuLaunchCooperativeKernel
#undef cuLaunchCooperativeKernel_ptsz
#undef cuGraphLaunch
#undef cuGraphLaunch_ptsz
__asm__(".intel_syntax noprefix\n.text\n" ALL_THUNKS(THUNK) ".att_syntax prefix\n");
#endif

EXPORT HOOKABLE CUresult cuStreamSynchronize(CUstream s) { return wait_for(SIM_API_STREAM_SYNCHRONIZE, last_launched(s)); }
EXPORT HOOKABLE CUresult cuStreamSynchronize_ptsz(CUstream s) { return wait_for(SIM_API_STREAM_SYNCHRONIZE + 1, last_launched(s)); }
EXPORT HOOKABLE CUresult cuCtxSynchronize(void) { return wait_for(SIM_API_CTX_SYNCHRONIZE, last_launched((CUstream)-1)); }
/* CUDA 13's cudaDeviceSynchronize waits here (the context argument: NULL for the current one). */
EXPORT HOOKABLE CUresult cuCtxSynchronize_v2(CUcontext c) { (void)c; return wait_for(SIM_API_CTX_SYNCHRONIZE_V2, last_launched((CUstream)-1)); }
EXPORT CUresult cuEventSynchronize(CUevent e) { (void)e; return wait_for(SIM_API_EVENT_SYNCHRONIZE, last_launched((CUstream)-1)); }

/* Synchronous copies wait for all prior work (legacy default stream semantics). */
EXPORT CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n) { (void)d; (void)s; (void)n; return wait_for(SIM_API_MEMCPY, last_launched((CUstream)-1)); }
EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { (void)d; (void)s; (void)n; return wait_for(SIM_API_MEMCPY_HTOD, last_launched((CUstream)-1)); }
EXPORT CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { (void)d; (void)s; (void)n; return wait_for(SIM_API_MEMCPY_DTOH, last_launched((CUstream)-1)); }
EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { (void)d; (void)s; (void)n; return wait_for(SIM_API_MEMCPY_DTOD, last_launched((CUstream)-1)); }

/* Stream progress marks (the shim's default recording): pinned host memory the "GPU" writes,
 * and a stream-ordered 64-bit write that waits in the same queue as kernels. */
EXPORT CUresult cuMemHostAlloc(void **p, size_t n, unsigned flags) {
    (void)flags;
    if (getenv("SIMCUDA_NO_HOST_ALLOC")) return 2; /* CUDA_ERROR_OUT_OF_MEMORY: the fallback */
    *p = aligned_alloc(4096, (n + 4095) / 4096 * 4096);
    return *p ? 0 : 2;
}
EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned flags) {
    (void)flags;
    *d = (CUdeviceptr)(uintptr_t)p;
    return 0;
}
/* SIMCUDA_DEVICE: the device this process's context is on (a rank on cuda:1). */
static int sim_device(void) {
    const char *d = getenv("SIMCUDA_DEVICE");
    return d ? atoi(d) : 0;
}
EXPORT CUresult cuCtxGetDevice(CUdevice *d) { *d = sim_device(); return 0; }
EXPORT CUresult cuCtxSetCurrent(CUcontext c) { (void)c; return 0; }
EXPORT CUresult cuThreadExchangeStreamCaptureMode(int *mode) { *mode = 0; return 0; }
EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c) { (void)c; return 0; }
EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *c) { *c = (CUcontext)0x1; return 0; }
/* SIMCUDA_WRITE_VALUE_FAILS=1: stream writes are refused (only event marks can work). */
EXPORT CUresult cuStreamWriteValue64_v2(CUstream s, CUdeviceptr addr, uint64_t value, unsigned flags) {
    (void)flags;
    if (!addr || getenv("SIMCUDA_WRITE_VALUE_FAILS")) return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&started, start_gpu);
    push(s, (struct item){&mark_op, 0, 0, 0, (_Atomic uint64_t *)(uintptr_t)addr, value});
    return CUDA_SUCCESS;
}

/* Events (the shim's event marks): a record waits in the queue like a kernel; the event has
 * passed once the "GPU" ran past it. A never-recorded event has passed, as on the real driver.
 * SIMCUDA_NO_EVENTS=1: cuEventCreate fails (the shim keeps stream writes). */
struct sim_event { _Atomic uint64_t seq; };
static _Atomic uint64_t events_live;
EXPORT CUresult cuEventCreate(CUevent *e, unsigned flags) {
    (void)flags;
    if (getenv("SIMCUDA_NO_EVENTS")) return 2;
    if (create_behind_full_queue()) wait_behind_full_queue();
    struct sim_event *ev = calloc(1, sizeof *ev);
    if (!ev) return 2;
    atomic_fetch_add(&events_live, 1);
    *e = (CUevent)ev;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventRecord(CUevent e, CUstream s) {
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&started, start_gpu);
    struct sim_event *ev = (struct sim_event *)e;
    /* The sequence number is assigned under the queue's lock and stored after it: a query
     * made before this call returns may see the previous record (as callers must expect). */
    atomic_store(&ev->seq, push(s, (struct item){&mark_op, 0, 0, 0, NULL, 0}));
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventQuery(CUevent e) {
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    if (query_behind_full_queue()) wait_behind_full_queue();
    return atomic_load(&completed_seq) >= atomic_load(&((struct sim_event *)e)->seq) ? CUDA_SUCCESS : 600;
}
EXPORT CUresult cuEventDestroy_v2(CUevent e) {
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    if (create_behind_full_queue()) wait_behind_full_queue();
    atomic_fetch_sub(&events_live, 1);
    free(e);
    return CUDA_SUCCESS;
}
/* Test control: events created and not destroyed. */
EXPORT uint64_t simcuda_events_live(void) { return atomic_load(&events_live); }

/* Test controls (not part of the CUDA API). */
EXPORT void simcuda_release(void) { atomic_store(&released, 1); }

#include "sim_graph.c"
