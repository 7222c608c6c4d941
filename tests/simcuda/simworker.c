/*
 * Workloads on the simulated driver: a serving worker that wedges, a healthy busy one, one
 * that churns short-lived threads, and a launch-bound loop for the benchmark.
 *
 *   simworker wedge   [run_s] [wedge_after_ms]   launcher thread keeps launching (blocks on the
 *                                                full queue behind "attn_wedge_kernel"); a
 *                                                syncer thread blocks in cuStreamSynchronize
 *   simworker healthy [run_s]                    short kernels + a sync every 64 launches, and
 *                                                one legitimately long kernel per run
 *   simworker threads [run_s]                    many short-lived launching threads
 *   simworker bench   [launches]                 prints "ns_per_launch N" (CPU time);
 *                                                SIMWORKER_POLLUTE_KB churns the caches between
 *                                                launches
 *   simworker spin [run_s]                       one kernel (and its synchronize), then spins on the
 *                                                host in wait_for_peers_ready: the boot deadlock
 *                                                (SIMWORKER_HEALTHY_BEFORE_S, _IDLE_BEFORE_S: after
 *                                                a healthy history; _SPIN_WHEN: once a file
 *                                                appears; _SPIN_LOOP=tight|libc: the loop's
 *                                                shape; see the mode)
 *   simworker idle-after [run_s]                 healthy for run_s, then three launches back to
 *                                                back and 10 s idle (no synchronize)
 *   simworker serve [run_s]                      never wedged: decode, idle, CPU work, long
 *                                                kernels with a synchronize and a queue (the mode)
 *   simworker tokenize [run_s]                   a core at 100% launching decode, then CPU work in
 *                                                one function with no driver call, then decode
 *                                                again: a busy server thread tokenizing (the mode)
 *   simworker exit-soon                          initialises CUDA and exits after 50 ms
 *   simworker loop [run_s]                       a launch loop (a sync every 64), no long kernel
 *   simworker graph [run_s]                      builds a CUDA graph node by node and replays it
 *                                                (a sync every 8 replays) until run_s; its shape:
 *                                                SIMWORKER_GRAPH_SHAPE=chain (default; _NODES
 *                                                kernels, default 12) | branches (a root, two
 *                                                branches of 5, a join) | child (a chain with a
 *                                                child graph of 3 kernels in the middle); the
 *                                                kernel at SIMWORKER_GRAPH_WEDGE_AT (node
 *                                                order, from 0) wedges (with SIMCUDA_WEDGE_ON_RUN
 *                                                = N, on replay N). SIMWORKER_GRAPH_REPLAYS=N:
 *                                                exactly N replays, then "kernels_run C hash H"
 *                                                (the graph's "output"). SIMWORKER_GRAPH_UPDATE=1:
 *                                                the exec is updated in place from a second graph
 *                                                of the same shape before the replays;
 *                                                SIMWORKER_GRAPH_BUILD=capture: a chain captured
 *                                                from the stream's launches (as PyTorch does);
 *                                                SIMWORKER_GRAPH_INSTANTIATE_FLAGS: its flags;
 *                                                SIMWORKER_GRAPH_EXECS=N: N instantiations,
 *                                                the last replayed (SIMWORKER_GRAPH_DESTROY=1:
 *                                                each destroyed once the next is made);
 *                                                SIMWORKER_GRAPH_SET_AT=K: kernel node K of the
 *                                                exec made "graph_swapped_k<K>_wedge" (grid
 *                                                300) by cuGraphExecKernelNodeSetParams_v2
 *                                                before the replays (SIMWORKER_GRAPH_SET_API=v1 |
 *                                                generic: the unversioned or the generic call)
 *
 * SIMWORKER_GUARD=1 adds a thread that waits in futex(FUTEX_WAIT) with known values in its
 * callee-saved, argument and vector registers, woken every 10 ms, and checks them after each
 * wake: what `wedgeprobe attach` must restore when it takes such a thread over. At exit it
 * prints "guard (KIND) wakes N corrupted M eintr E" and the process exits 3 if M or E > 0.
 * SIMWORKER_GUARD=KIND waits otherwise (the waits attach borrows a thread from): futex-timed
 * (200 ms relative), futex-until (FUTEX_WAIT_BITSET, 200 ms ahead), epoll (epoll_wait, no
 * timeout, on a pipe), poll (no timeout), ppoll (5 s), select (no timeout), read (a pipe),
 * nanosleep (20 ms), sleep-until (clock_nanosleep TIMER_ABSTIME, 20 ms ahead); the waker
 * writes the pipe every 10 ms where there is one.
 *
 * SIMWORKER_IDLE_THREADS=N parks N extra threads in condition waits (a PyTorch process has
 * 50-90 threads, most of them idle pools: what a probe pays per thread shows up with them);
 * SIMWORKER_PACE_US sets healthy's pause between launches (default 50; 0: launch-bound).
 * SIMWORKER_BURST=N launches N prefills back to back just before the wedged kernel (so stream
 * marks cannot bracket it alone: the report must list candidates);
 * SIMWORKER_START_DELAY_MS delays everything (a probe can attach before the kernel lookups);
 * SIMWORKER_LAUNCH_API=ex launches through cuLaunchKernelEx; SIMWORKER_SYNC_API=ctx|ctx_v2|copy
 * makes the syncer wait in cuCtxSynchronize, cuCtxSynchronize_v2 or a blocking cuMemcpyDtoH
 * (none: it never synchronizes); SIMWORKER_AFTER_WEDGE_US paces the launches behind the wedge.
 *
 * The process releases itself: the wedged kernel completes after SIMCUDA_RELEASE_AFTER_S,
 * and every mode exits after run_s.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <stdio.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

#include "cuda_sim.h"

static CUstream stream;
static CUfunction prefill, decode, wedge, long_kernel;
static volatile int stop;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The stack below a launch call, touched: an interpreter's deep calls between two launches
 * keep it warm, so SIMWORKER_POLLUTE_KB evicts the heap and globals but not the stack. */
static __attribute__((noinline)) void warm_stack(void) {
    volatile char below[16384];
    for (int i = 0; i < (int)sizeof below; i += 64) below[i] = 0;
}

/* A server's CPU work between requests (tokenizing, building a batch): seconds at 100% of a
 * core inside one function, so its stack reads the same — healthy work a host-stall verdict
 * must not take for a spin when it follows an idle gap. */
static volatile unsigned long tokens;
__attribute__((noinline)) static void tokenize_batch(double secs) {
    double until = now_s() + secs;
    while (now_s() < until) {
        for (int i = 0; i < 100000; i++) tokens += (unsigned long)i * 2654435761u;
    }
}

/* A rank busy-polling its peers on the host, no kernel launched ("waiting for ranks: 0/1821
 * ready"): what the host-stall verdict must find, with this function on the stack. */
static volatile unsigned long peers_ready;
__attribute__((noinline)) static void wait_for_peers_ready(double until) {
    while (now_s() < until) {
        for (int i = 0; i < 100000; i++) peers_ready += (unsigned long)i & 1;
    }
}

/* The same wait as a tight loop with no call in it (SIMWORKER_SPIN_LOOP=tight): a flag read
 * over and over, set by a timer thread at the deadline — no libc, no vDSO, no syscall; the
 * stack is the loop's own frame and its callers. */
static volatile int peers_flag;
static double spin_until;
static void *spin_timer(void *arg) {
    (void)arg;
    double left = spin_until - now_s();
    if (left > 0) usleep((useconds_t)(left * 1e6));
    peers_flag = 1;
    return NULL;
}
__attribute__((noinline)) static void wait_for_peers_ready_tight(double until) {
    pthread_t t;
    spin_until = until;
    pthread_create(&t, NULL, spin_timer, NULL);
    while (!peers_flag) peers_ready++;
}

/* And as a loop calling into libc every turn (SIMWORKER_SPIN_LOOP=libc), as a handshake
 * polling for a peer's file does: access(2) of a path that never appears. */
__attribute__((noinline)) static void wait_for_peers_ready_libc(double until) {
    while (access("/nonexistent/wedgeprobe-peer.ready", F_OK) != 0 && now_s() < until)
        peers_ready++;
}

static int use_launch_ex; /* SIMWORKER_LAUNCH_API=ex: launch through cuLaunchKernelEx */

static void launch(CUfunction f) {
    CUresult r;
    if (use_launch_ex) {
        CUlaunchConfig c = {66, 4, 2, 256, 2, 1, 8192, stream, NULL, 0};
        r = cuLaunchKernelEx(&c, f, NULL, NULL);
    } else {
        r = cuLaunchKernel(f, 132, 2, 1, 128, 1, 1, 4096, stream, NULL, NULL);
    }
    if (r != 0) {
        fprintf(stderr, "simworker: launch failed\n");
        exit(1);
    }
}

/* SIMWORKER_SYNC_API=stream (default) | ctx | ctx_v2 | copy: how the syncer thread waits. */
static void *syncer(void *arg) {
    const char *how = arg;
    char buf[64];
    while (!stop) {
        if (!strcmp(how, "none")) {
            usleep(20000);
            continue;
        }
        if (!strcmp(how, "ctx")) cuCtxSynchronize();
        else if (!strcmp(how, "ctx_v2")) cuCtxSynchronize_v2(NULL);
        else if (!strcmp(how, "copy")) cuMemcpyDtoH_v2(buf, 0x1000, sizeof buf);
        else cuStreamSynchronize(stream);
        usleep(20000);
    }
    return NULL;
}

static pthread_mutex_t idle_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t idle_cv = PTHREAD_COND_INITIALIZER;

static void *idle_pool_thread(void *arg) {
    (void)arg;
    pthread_mutex_lock(&idle_mu);
    while (!stop) pthread_cond_wait(&idle_cv, &idle_mu);
    pthread_mutex_unlock(&idle_mu);
    return NULL;
}

static void *short_lived(void *arg) {
    (void)arg;
    for (int i = 0; i < 20; i++) launch(decode);
    cuStreamSynchronize(stream);
    return NULL;
}

/* SIMWORKER_GUARD (see the header). The futex word is never changed: only wakes end a wait. */
static int guard_word;
static volatile long guard_wakes, guard_bad, guard_eintr;
static const char *guard_kind = "futex";
static int guard_pipe[2] = {-1, -1};
static int guard_epoll = -1;

/* One system call (nr, then six arguments) with known values in the callee-saved and vector
 * registers, then their check and the argument registers' (the kernel keeps them all): returns
 * how many differ; *ret gets the call's result. */
static long guard_call(const long c[7], long *ret) {
    long bad = 0, r;
    __asm__ volatile(
        "movabs $0x1111111111111111, %%r12\n\t"
        "movabs $0x2222222222222222, %%r13\n\t"
        "movabs $0x3333333333333333, %%r14\n\t"
        "movabs $0x4444444444444444, %%r15\n\t"
        "movq %%r12, %%xmm6\n\t"
        "movq %%r13, %%xmm7\n\t"
        "movq %%r14, %%xmm8\n\t"
        "mov %[c], %%rbx\n\t"
        "mov 8(%%rbx), %%rdi\n\t"
        "mov 16(%%rbx), %%rsi\n\t"
        "mov 24(%%rbx), %%rdx\n\t"
        "mov 32(%%rbx), %%r10\n\t"
        "mov 40(%%rbx), %%r8\n\t"
        "mov 48(%%rbx), %%r9\n\t"
        "mov (%%rbx), %%rax\n\t"
        "syscall\n\t"
        "mov %%rax, %[r]\n\t"
        "xor %%ecx, %%ecx\n\t"
        "movabs $0x1111111111111111, %%rax\n\t"
        "cmp %%rax, %%r12\n\t" "setne %%cl\n\t" "add %%rcx, %[bad]\n\t"
        "movabs $0x2222222222222222, %%rax\n\t"
        "cmp %%rax, %%r13\n\t" "setne %%cl\n\t" "add %%rcx, %[bad]\n\t"
        "movabs $0x3333333333333333, %%rax\n\t"
        "cmp %%rax, %%r14\n\t" "setne %%cl\n\t" "add %%rcx, %[bad]\n\t"
        "movabs $0x4444444444444444, %%rax\n\t"
        "cmp %%rax, %%r15\n\t" "setne %%cl\n\t" "add %%rcx, %[bad]\n\t"
        "cmp 8(%%rbx), %%rdi\n\t" "setne %%cl\n\t" "add %%rcx, %[bad]\n\t"
        "cmp 16(%%rbx), %%rsi\n\t" "setne %%cl\n\t" "add %%rcx, %[bad]\n\t"
        "cmp 24(%%rbx), %%rdx\n\t" "setne %%cl\n\t" "add %%rcx, %[bad]\n\t"
        "cmp 32(%%rbx), %%r10\n\t" "setne %%cl\n\t" "add %%rcx, %[bad]\n\t"
        "cmp 40(%%rbx), %%r8\n\t" "setne %%cl\n\t" "add %%rcx, %[bad]\n\t"
        "cmp 48(%%rbx), %%r9\n\t" "setne %%cl\n\t" "add %%rcx, %[bad]\n\t"
        "movq %%xmm6, %%rax\n\t" "cmp %%rax, %%r12\n\t" "setne %%cl\n\t" "add %%rcx, %[bad]\n\t"
        "movq %%xmm7, %%rax\n\t" "cmp %%rax, %%r13\n\t" "setne %%cl\n\t" "add %%rcx, %[bad]\n\t"
        "movq %%xmm8, %%rax\n\t" "cmp %%rax, %%r14\n\t" "setne %%cl\n\t" "add %%rcx, %[bad]\n\t"
        : [bad] "+r"(bad), [r] "=m"(r)
        : [c] "m"(c)
        : "rax", "rbx", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11", "r12", "r13",
          "r14", "r15", "xmm6", "xmm7", "xmm8", "memory", "cc");
    *ret = r;
    return bad;
}

static struct timespec guard_deadline(long ms) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_nsec += ms * 1000000L;
    t.tv_sec += t.tv_nsec / 1000000000L;
    t.tv_nsec %= 1000000000L;
    return t;
}

/* One wait of SIMWORKER_GUARD's kind: the system calls an attach may borrow a thread from. */
static long guard_wait(void) {
    const char *k = guard_kind;
    char byte;
    struct pollfd pfd = {.fd = guard_pipe[0], .events = POLLIN};
    struct epoll_event ev;
    struct timespec ts = {0, 200 * 1000000L}, abs_ts = guard_deadline(200);
    struct timespec nap = {0, 20 * 1000000L}, nap_until = guard_deadline(20);
    fd_set rd;
    FD_ZERO(&rd);
    FD_SET(guard_pipe[0] < 0 ? 0 : guard_pipe[0], &rd);
    long c[7] = {202, (long)&guard_word, 0x80 /* FUTEX_WAIT_PRIVATE */, 0, 0, 0, 0};
    if (!strcmp(k, "futex-timed")) { c[4] = (long)&ts; }
    else if (!strcmp(k, "futex-until")) { c[2] = 0x89 /* WAIT_BITSET_PRIVATE */; c[4] = (long)&abs_ts; c[6] = -1; }
    else if (!strcmp(k, "epoll")) { long e[7] = {232, guard_epoll, (long)&ev, 1, -1, 0, 0}; memcpy(c, e, sizeof c); }
    else if (!strcmp(k, "poll")) { long e[7] = {7, (long)&pfd, 1, -1, 0, 0, 0}; memcpy(c, e, sizeof c); }
    else if (!strcmp(k, "ppoll")) { long e[7] = {271, (long)&pfd, 1, (long)&ts, 0, 8, 0}; ts.tv_sec = 5; memcpy(c, e, sizeof c); }
    else if (!strcmp(k, "select")) { long e[7] = {23, guard_pipe[0] + 1, (long)&rd, 0, 0, 0, 0}; memcpy(c, e, sizeof c); }
    else if (!strcmp(k, "read")) { long e[7] = {0, guard_pipe[0], (long)&byte, 1, 0, 0, 0}; memcpy(c, e, sizeof c); }
    else if (!strcmp(k, "nanosleep")) { long e[7] = {35, (long)&nap, 0, 0, 0, 0, 0}; memcpy(c, e, sizeof c); }
    else if (!strcmp(k, "sleep-until")) { long e[7] = {230, CLOCK_MONOTONIC, 1 /* TIMER_ABSTIME */, (long)&nap_until, 0, 0, 0}; memcpy(c, e, sizeof c); }
    long ret;
    long bad = guard_call(c, &ret);
    if (ret == -EINTR) guard_eintr++;
    /* Drain what woke it (the pipe's byte; the read took its own). */
    if (guard_pipe[0] >= 0 && strcmp(k, "read") != 0 && ret > 0) {
        while (read(guard_pipe[0], &byte, 1) == 1) {}
    }
    return bad;
}

static void *guard_thread(void *arg) {
    (void)arg;
    for (;;) {
        long b = guard_wait();
        guard_bad += b;
        guard_wakes++;
    }
    return NULL;
}

static void *guard_waker(void *arg) {
    (void)arg;
    /* Its 10 ms pause is a wait attach does not borrow threads from (sigtimedwait on a signal
     * never sent), so the guard is the thread an attach takes. */
    sigset_t none;
    sigemptyset(&none);
    sigaddset(&none, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &none, NULL);
    struct timespec tick = {0, 10 * 1000000L};
    for (;;) {
        sigtimedwait(&none, NULL, &tick);
        if (guard_pipe[1] >= 0) {
            char b = 1;
            if (write(guard_pipe[1], &b, 1) < 0) {}
        } else {
            syscall(202, &guard_word, 0x81 /* FUTEX_WAKE_PRIVATE */, 1, NULL, NULL, 0);
        }
    }
    return NULL;
}

/* SIMWORKER_GUARD's kind: "1" or "futex" (the default), or another wait (see the header). */
static void guard_start(const char *kind) {
    if (strcmp(kind, "1") != 0) guard_kind = kind;
    if (!strcmp(guard_kind, "epoll") || !strcmp(guard_kind, "poll") || !strcmp(guard_kind, "ppoll") ||
        !strcmp(guard_kind, "select") || !strcmp(guard_kind, "read")) {
        if (pipe(guard_pipe) != 0) { perror("pipe"); exit(2); }
        /* Drained without blocking; the read kind reads one byte at a time anyway. */
        if (strcmp(guard_kind, "read") != 0) fcntl(guard_pipe[0], F_SETFL, O_NONBLOCK);
    }
    if (!strcmp(guard_kind, "epoll")) {
        guard_epoll = epoll_create1(0);
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = guard_pipe[0]};
        epoll_ctl(guard_epoll, EPOLL_CTL_ADD, guard_pipe[0], &ev);
    }
}

static void guard_report(void) {
    if (!getenv("SIMWORKER_GUARD")) return;
    printf("guard (%s) wakes %ld corrupted %ld eintr %ld\n", guard_kind, guard_wakes, guard_bad,
           guard_eintr);
    fflush(stdout);
    if (guard_bad || guard_eintr) _exit(3);
}

/* One kernel node of the graph modes: "graph_k<i>", or a wedging one at `wedge_at`. */
static CUgraphNode graph_kernel_node(CUgraph g, const CUgraphNode *deps, size_t n, int i, int wedge_at,
                                     const char *prefix) {
    char name[64];
    snprintf(name, sizeof name, i == wedge_at ? "%s_k%d_wedge" : "%s_k%d", prefix, i);
    CUfunction f;
    cuModuleGetFunction(&f, NULL, name);
    CUDA_KERNEL_NODE_PARAMS_v2 p = {0};
    p.func = f;
    p.gridDimX = 64 + i; p.gridDimY = 1; p.gridDimZ = 1;
    p.blockDimX = 128; p.blockDimY = 1; p.blockDimZ = 1;
    CUgraphNode node = NULL;
    cuGraphAddKernelNode_v2(&node, g, deps, n, &p);
    return node;
}

static CUgraph build_graph(const char *shape, int nodes, int wedge_at, const char *prefix) {
    CUgraph g;
    int i = 0;
    const char *build = getenv("SIMWORKER_GRAPH_BUILD");
    if (build && !strcmp(build, "capture")) {
        cuStreamBeginCapture_v2(stream, 0);
        for (int k = 0; k < nodes; k++) {
            char name[64];
            snprintf(name, sizeof name, k == wedge_at ? "%s_k%d_wedge" : "%s_k%d", prefix, k);
            CUfunction f;
            cuModuleGetFunction(&f, NULL, name);
            cuLaunchKernel(f, 64 + k, 1, 1, 128, 1, 1, 0, stream, NULL, NULL);
        }
        cuStreamEndCapture(stream, &g);
        return g;
    }
    cuGraphCreate(&g, 0);
    if (!strcmp(shape, "branches")) {
        CUgraphNode root = graph_kernel_node(g, NULL, 0, i++, wedge_at, prefix), ends[2];
        for (int b = 0; b < 2; b++) {
            CUgraphNode prev = root;
            for (int k = 0; k < 5; k++) prev = graph_kernel_node(g, &prev, 1, i++, wedge_at, prefix);
            ends[b] = prev;
        }
        graph_kernel_node(g, ends, 2, i++, wedge_at, prefix);
    } else if (!strcmp(shape, "child")) {
        CUgraphNode prev = NULL;
        for (int k = 0; k < 4; k++) prev = graph_kernel_node(g, prev ? &prev : NULL, prev != NULL, i++, wedge_at, prefix);
        CUgraph child;
        cuGraphCreate(&child, 0);
        CUgraphNode cprev = NULL;
        for (int k = 0; k < 3; k++) cprev = graph_kernel_node(child, cprev ? &cprev : NULL, cprev != NULL, 100 + k, wedge_at, prefix);
        cuGraphAddChildGraphNode(&prev, g, &prev, 1, child);
        for (int k = 0; k < 4; k++) prev = graph_kernel_node(g, &prev, 1, i++, wedge_at, prefix);
    } else {
        CUgraphNode prev = NULL;
        for (int k = 0; k < nodes; k++) prev = graph_kernel_node(g, prev ? &prev : NULL, prev != NULL, i++, wedge_at, prefix);
    }
    return g;
}

static void run_graph(double run_s, double start) {
    const char *shape = getenv("SIMWORKER_GRAPH_SHAPE");
    const char *nodes = getenv("SIMWORKER_GRAPH_NODES");
    const char *at = getenv("SIMWORKER_GRAPH_WEDGE_AT");
    const char *replays = getenv("SIMWORKER_GRAPH_REPLAYS");
    int wedge_at = at ? atoi(at) : -1;
    shape = shape ? shape : "chain";
    CUgraph g = build_graph(shape, nodes ? atoi(nodes) : 12, wedge_at, "graph");
    CUgraphExec exec;
    /* SIMWORKER_GRAPH_INSTANTIATE_FLAGS: e.g. 4, CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH. */
    const char *iflags = getenv("SIMWORKER_GRAPH_INSTANTIATE_FLAGS");
    if (cuGraphInstantiateWithFlags(&exec, g, iflags ? strtoull(iflags, NULL, 0) : 0) != 0) {
        fprintf(stderr, "simworker: cuGraphInstantiateWithFlags failed\n");
        exit(2);
    }
    /* SIMWORKER_GRAPH_EXECS=N: N instantiations of the graph in all, the last one replayed
     * (the others kept: a server's many captured batch sizes). */
    const char *execs = getenv("SIMWORKER_GRAPH_EXECS");
    /* SIMWORKER_GRAPH_DESTROY=1: each exec destroyed once the next is made (a server that
     * captures its graphs again: a model reloaded, its batch sizes captured anew). */
    int destroy = getenv("SIMWORKER_GRAPH_DESTROY") != NULL;
    for (int k = 1; execs && k < atoi(execs); k++) {
        CUgraphExec before = exec;
        if (cuGraphInstantiateWithFlags(&exec, g, 0) != 0) {
            fprintf(stderr, "simworker: cuGraphInstantiateWithFlags failed\n");
            exit(2);
        }
        if (destroy && cuGraphExecDestroy(before) != 0) {
            fprintf(stderr, "simworker: cuGraphExecDestroy failed\n");
            exit(2);
        }
    }
    if (getenv("SIMWORKER_GRAPH_UPDATE")) {
        CUgraph g2 = build_graph(shape, nodes ? atoi(nodes) : 12, wedge_at, "graph_updated");
        int r = cuGraphExecUpdate_v2(exec, g2, NULL);
        printf("exec_update %d\n", r);
        fflush(stdout);
    }
    const char *set_at = getenv("SIMWORKER_GRAPH_SET_AT");
    if (set_at) {
        size_t count = 0;
        cuGraphGetNodes(g, NULL, &count);
        CUgraphNode *all = calloc(count, sizeof *all);
        cuGraphGetNodes(g, all, &count);
        int k = atoi(set_at);
        char name[64];
        snprintf(name, sizeof name, "graph_swapped_k%d_wedge", k);
        CUfunction f;
        cuModuleGetFunction(&f, NULL, name);
        CUDA_KERNEL_NODE_PARAMS_v2 p = {0};
        p.func = f;
        p.gridDimX = 300; p.gridDimY = 1; p.gridDimZ = 1;
        p.blockDimX = 128; p.blockDimY = 1; p.blockDimZ = 1;
        /* SIMWORKER_GRAPH_SET_API=v1 | generic: through cuGraphExecKernelNodeSetParams (the
         * CUDA 11 layout) or cuGraphExecNodeSetParams (CUgraphNodeParams) instead. */
        const char *api = getenv("SIMWORKER_GRAPH_SET_API");
        int r = -1;
        if (k < 0 || (size_t)k >= count)
            r = -1;
        else if (api && !strcmp(api, "v1"))
            r = cuGraphExecKernelNodeSetParams(exec, all[k], &p);
        else if (api && !strcmp(api, "generic")) {
            long long np[32] = {0}; /* CUgraphNodeParams: 256 bytes */
            ((int *)np)[0] = 0;     /* CU_GRAPH_NODE_TYPE_KERNEL */
            memcpy((char *)np + 16, &p, sizeof p);
            r = cuGraphExecNodeSetParams(exec, all[k], np);
        } else
            r = cuGraphExecKernelNodeSetParams_v2(exec, all[k], &p);
        printf("set_params %d\n", r);
        fflush(stdout);
        free(all);
    }
    long n = 0, limit = replays ? atol(replays) : -1;
    while (limit >= 0 ? n < limit : now_s() - start < run_s) {
        cuGraphLaunch(exec, stream);
        if (++n % 8 == 0) cuStreamSynchronize(stream);
        if (limit < 0) usleep(200);
    }
    cuStreamSynchronize(stream);
    unsigned long long count, hash;
    simcuda_kernel_log(&count, &hash);
    printf("kernels_run %llu hash %llx\n", count, hash);
    fflush(stdout);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "wedge";
    double run_s = argc > 2 ? atof(argv[2]) : 15;
    /* SIMWORKER_START_DELAY_MS: time for a probe to attach before the kernels are looked up. */
    const char *api = getenv("SIMWORKER_LAUNCH_API");
    use_launch_ex = api && !strcmp(api, "ex");
    const char *delay = getenv("SIMWORKER_START_DELAY_MS");
    if (delay) usleep(atoi(delay) * 1000);
    cuInit(0);
    cuStreamCreate(&stream, 0);
    cuModuleGetFunction(&prefill, NULL, "_Z14prefill_kernelPfS_i");
    cuModuleGetFunction(&decode, NULL, "_Z13decode_kernelPKfPfi");
    /* SIMWORKER_WEDGE_NAME: the stuck kernel's name (a collective's, for the culprit tests). */
    const char *wedge_name = getenv("SIMWORKER_WEDGE_NAME");
    cuModuleGetFunction(&wedge, NULL, wedge_name ? wedge_name : "_Z17attn_wedge_kernelP7barrierPf");
    cuModuleGetFunction(&long_kernel, NULL, "_Z11long_kernelPf");
    pthread_setname_np(pthread_self(), "launcher");
    const char *idle = getenv("SIMWORKER_IDLE_THREADS");
    for (int i = 0; idle && i < atoi(idle); i++) {
        pthread_t t;
        pthread_create(&t, NULL, idle_pool_thread, NULL);
        pthread_detach(t);
    }
    if (getenv("SIMWORKER_GUARD")) {
        pthread_t g, w;
        guard_start(getenv("SIMWORKER_GUARD"));
        pthread_create(&g, NULL, guard_thread, NULL);
        pthread_setname_np(g, "guard");
        pthread_create(&w, NULL, guard_waker, NULL);
        pthread_setname_np(w, "waker");
        atexit(guard_report);
    }
    /* SIMWORKER_FORK_CHILD: once CUDA is in use, fork a child that exits normally (its atexit
     * handlers run), as a server forks a helper without exec; `launch`: the child launches
     * once first (CUDA forbids it after fork, but a hook in the child must still never write
     * its parent's journal). The parent then runs its mode. */
    const char *fork_child = getenv("SIMWORKER_FORK_CHILD");
    if (fork_child) {
        launch(decode);
        cuStreamSynchronize(stream);
        pid_t c = fork();
        if (c == 0) {
            if (!strcmp(fork_child, "launch")) launch(decode);
            exit(0);
        }
        waitpid(c, NULL, 0);
    }
    /* SIMWORKER_LAUNCH_DELAY_MS: CUDA set up (the shim's journal made), then a pause before
     * the mode runs: time for a tracer to find the journal before the first launch. */
    const char *launch_delay = getenv("SIMWORKER_LAUNCH_DELAY_MS");
    if (launch_delay) usleep(atoi(launch_delay) * 1000);
    const char *pace = getenv("SIMWORKER_PACE_US");
    int pace_us = pace ? atoi(pace) : 50;
    double start = now_s();

    if (!strcmp(mode, "graph")) {
        run_graph(run_s, start);
    } else if (!strcmp(mode, "wedge")) {
        double wedge_after = (argc > 3 ? atof(argv[3]) : 300) / 1e3;
        pthread_t t;
        const char *how = getenv("SIMWORKER_SYNC_API");
        /* SIMWORKER_SYNC_API=none: no syncer thread. */
        pthread_create(&t, NULL, syncer, (void *)(how ? how : "stream"));
        pthread_setname_np(t, "syncer");
        while (now_s() - start < wedge_after) {
            launch(prefill);
            usleep(100);
        }
        const char *burst = getenv("SIMWORKER_BURST");
        for (int i = 0; burst && i < atoi(burst); i++) launch(prefill);
        launch(wedge);
        /* SIMWORKER_AFTER_WEDGE_US: a pause between the launches behind the wedge (the queue
         * then fills slowly: a stuck kernel with no thread blocked behind it for a while). */
        const char *after = getenv("SIMWORKER_AFTER_WEDGE_US");
        while (now_s() - start < run_s) {
            launch(decode); /* blocks once 1021 are queued */
            if (after) usleep(atoi(after));
        }
        cuStreamSynchronize(stream); /* with run_s <= wedge_after: only synchronizes wait */
        stop = 1;
        pthread_join(t, NULL);
    } else if (!strcmp(mode, "healthy")) {
        long n = 0;
        launch(long_kernel);
        while (now_s() - start < run_s) {
            launch(decode);
            if (++n % 64 == 0) cuStreamSynchronize(stream);
            if (pace_us > 0) usleep(pace_us);
        }
        cuCtxSynchronize();
    } else if (!strcmp(mode, "loop")) {
        long n = 0;
        while (now_s() - start < run_s) {
            launch(decode);
            if (++n % 64 == 0) cuStreamSynchronize(stream);
            if (pace_us > 0) usleep(pace_us);
        }
        cuCtxSynchronize();
    } else if (!strcmp(mode, "threads")) {
        while (now_s() - start < run_s) {
            pthread_t t;
            pthread_create(&t, NULL, short_lived, NULL);
            pthread_join(t, NULL);
        }
    } else if (!strcmp(mode, "bench")) {
        long launches = argc > 2 ? atol(argv[2]) : 200000;
        /* SIMWORKER_POLLUTE_KB: between launches, write one word in each cache line of that
         * many KiB, as the Python interpreter between a serving loop's launches churns the
         * caches (a shim's cost there is mostly its cold lines, not its instructions); the
         * stack stays warm (warm_stack). */
        long pollute = getenv("SIMWORKER_POLLUTE_KB") ? atol(getenv("SIMWORKER_POLLUTE_KB")) : 0;
        volatile char *junk = pollute > 0 ? calloc((size_t)pollute, 1024) : NULL;
        /* SIMWORKER_STREAMS=N: the launches go round-robin over N streams (the first is the
         * worker's stream), each stream getting launches/N of them. */
        long nstreams = getenv("SIMWORKER_STREAMS") ? atol(getenv("SIMWORKER_STREAMS")) : 1;
        if (nstreams < 1 || nstreams > 64) nstreams = 1;
        CUstream streams[64];
        streams[0] = stream;
        for (long s = 1; s < nstreams; s++) cuStreamCreate(&streams[s], 0);
        struct timespec a, b;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
        double w0 = now_s();
        for (long i = 0; i < launches; i++) {
            stream = streams[i % nstreams];
            launch(decode);
            if (i % 1000 == 999) {
                if (nstreams == 1) cuStreamSynchronize(stream); /* never fill the queue */
                else cuCtxSynchronize();
            }
            for (long k = 0; junk && k < pollute * 1024; k += 64) junk[k]++;
            if (junk) warm_stack();
        }
        if (nstreams == 1) cuStreamSynchronize(stream);
        else cuCtxSynchronize();
        stream = streams[0];
        double wall = now_s() - w0;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
        (void)a;
        double cpu = b.tv_sec + b.tv_nsec / 1e9;
        printf("launches %ld wall_ns_per_launch %.1f thread_cpu_ns_per_launch %.1f\n", launches,
               wall * 1e9 / launches, cpu * 1e9 / launches);
    } else if (!strcmp(mode, "serve")) {
        /* Never wedged, in turns until run_s: decode (1.5 s), idle (SIMWORKER_IDLE_S, default
         * 11 s: past the default stall_after), 3 s of CPU work in one function, a long kernel
         * (SIMCUDA_LONG_KERNEL_MS, 3 s) then a synchronize, a long kernel with 1500 launches
         * queued behind it (the launcher blocks in the full queue) then a synchronize. */
        double idle = getenv("SIMWORKER_IDLE_S") ? atof(getenv("SIMWORKER_IDLE_S")) : 11;
        while (now_s() - start < run_s) {
            double t = now_s();
            long n = 0;
            while (now_s() - t < 1.5) {
                launch(decode);
                if (++n % 64 == 0) cuStreamSynchronize(stream);
                usleep(50);
            }
            cuStreamSynchronize(stream);
            usleep((useconds_t)(idle * 1e6));
            tokenize_batch(3.0);
            launch(long_kernel);
            cuStreamSynchronize(stream);
            launch(long_kernel);
            for (int i = 0; i < 1500; i++) launch(decode);
            cuStreamSynchronize(stream);
        }
    } else if (!strcmp(mode, "idle-after")) {
        long n = 0;
        while (now_s() - start < run_s) {
            launch(decode);
            if (++n % 64 == 0) cuStreamSynchronize(stream);
            usleep(50);
        }
        for (int i = 0; i < 3; i++) launch(decode);
        sleep(10);
    } else if (!strcmp(mode, "spin")) {
        /* SIMWORKER_HEALTHY_BEFORE_S=H: light serving first (a launch and its synchronize
         * every 20 ms, for H s); SIMWORKER_IDLE_BEFORE_S=I: then I s idle; SIMWORKER_SPIN_MARK
         * =FILE: created when the spin begins. */
        /* SIMWORKER_SPIN_WHEN=FILE: serve so until FILE exists (a spin that begins while a
         * probe watches); SIMWORKER_SPIN_LOOP=tight|libc: the loop's shape (above). */
        double healthy = getenv("SIMWORKER_HEALTHY_BEFORE_S") ? atof(getenv("SIMWORKER_HEALTHY_BEFORE_S")) : 0;
        double idle = getenv("SIMWORKER_IDLE_BEFORE_S") ? atof(getenv("SIMWORKER_IDLE_BEFORE_S")) : 0;
        const char *when = getenv("SIMWORKER_SPIN_WHEN");
        const char *shape = getenv("SIMWORKER_SPIN_LOOP");
        launch(decode);
        cuStreamSynchronize(stream);
        while (now_s() - start < healthy || (when && access(when, F_OK) != 0 && now_s() - start < run_s)) {
            launch(decode);
            cuStreamSynchronize(stream);
            usleep(20000);
        }
        if (idle > 0) usleep((useconds_t)(idle * 1e6));
        if (getenv("SIMWORKER_SPIN_MARK")) {
            FILE *f = fopen(getenv("SIMWORKER_SPIN_MARK"), "w");
            if (f) fclose(f);
        }
        if (shape && !strcmp(shape, "tight"))
            wait_for_peers_ready_tight(start + run_s);
        else if (shape && !strcmp(shape, "libc"))
            wait_for_peers_ready_libc(start + run_s);
        else
            wait_for_peers_ready(start + run_s);
    } else if (!strcmp(mode, "tokenize")) {
        /* Launch-bound decode (a core at 100%, calls returning) for SIMWORKER_HEALTHY_BEFORE_S
         * (default 4), then SIMWORKER_CPU_S (default 2.5) of CPU work in one function with no
         * driver call, then decode again until run_s. SIMWORKER_SPIN_MARK=FILE is created when
         * the CPU work begins. Its life averages ~100% of a core: what must not date the CPU
         * work as a spin that began at its start. */
        double busy = getenv("SIMWORKER_HEALTHY_BEFORE_S") ? atof(getenv("SIMWORKER_HEALTHY_BEFORE_S")) : 4;
        double cpu = getenv("SIMWORKER_CPU_S") ? atof(getenv("SIMWORKER_CPU_S")) : 2.5;
        long n = 0;
        while (now_s() - start < busy) {
            launch(decode);
            if (++n % 64 == 0) cuStreamSynchronize(stream);
        }
        cuStreamSynchronize(stream);
        if (getenv("SIMWORKER_SPIN_MARK")) {
            FILE *f = fopen(getenv("SIMWORKER_SPIN_MARK"), "w");
            if (f) fclose(f);
        }
        tokenize_batch(cpu);
        while (now_s() - start < run_s) {
            launch(decode);
            if (++n % 64 == 0) cuStreamSynchronize(stream);
        }
        cuStreamSynchronize(stream);
    } else if (!strcmp(mode, "exit-soon")) {
        usleep(50000);
    } else {
        fprintf(stderr, "simworker: unknown mode %s\n", mode);
        return 2;
    }
    /* SIMWORKER_LINGER_S=L: sleep L s before exiting (a process that stopped working but
     * lives on: a report that ends meanwhile is about a live, idle process). */
    if (getenv("SIMWORKER_LINGER_S")) usleep((useconds_t)(atof(getenv("SIMWORKER_LINGER_S")) * 1e6));
    return 0;
}
