/*
 * The CUDA graph API of the simulated driver, #included by libcuda_sim.c (it shares the
 * queue): what the shim's graph marks need (cupti-shim/src/marks/graph.rs) and what the
 * workloads build graphs with. Graphs built node by node (kernel, empty, child graph and
 * batch mem-op nodes of 32/64-bit writes), their nodes and edges listed, nodes destroyed;
 * instantiation copies the nodes in a topological order (child graphs inlined), so the exec
 * outlives the nodes taken out of its graph; a replay queues every node on the launch's
 * stream in that order (the serial "GPU" runs branches one after another), then the launch's
 * own completion; an exec update takes new kernels and dimensions where the topology is the
 * same, and fails like the real driver where it is not; a kernel node's function and
 * dimensions set in an exec (`cuGraphExecKernelNodeSetParams` and its v2, `cuGraphExecNodeSetParams`).
 * Stream capture (one stream at a time): launches into a capturing stream become a chain of
 * kernel nodes.
 */
enum { NODE_KERNEL = 0, NODE_CHILD = 4, NODE_EMPTY = 5, NODE_BATCH_MEM_OP = 12 };
enum { CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910 };

struct sim_node {
    struct sim_graph *g;
    int type;
    struct sim_kernel *k;
    unsigned grid[3], block[3];
    struct sim_graph *child;
    unsigned nops;
    CUstreamMemOpWrite *ops;
    struct sim_node **deps;
    unsigned ndeps;
    /* In an exec: the graph node it was instantiated from (what a set-params call names). */
    struct sim_node *orig;
};
struct sim_graph { struct sim_node **nodes; unsigned n; };
#define SIM_EXEC_MAGIC 0x5e7ec0deu
struct sim_exec { unsigned magic, n; struct sim_node *nodes; };

static pthread_mutex_t graph_mu = PTHREAD_MUTEX_INITIALIZER;

EXPORT CUresult cuGraphCreate(CUgraph *g, unsigned flags) {
    (void)flags;
    *g = calloc(1, sizeof **g);
    return *g ? CUDA_SUCCESS : 2;
}

static struct sim_node *add_node(struct sim_graph *g, int type, const CUgraphNode *deps, size_t n) {
    struct sim_node *node = calloc(1, sizeof *node);
    struct sim_node **nodes = realloc(g->nodes, (g->n + 1) * sizeof *nodes);
    if (!node || !nodes) { free(node); return NULL; }
    g->nodes = nodes;
    node->g = g;
    node->type = type;
    if (n) {
        node->deps = malloc(n * sizeof *node->deps);
        memcpy(node->deps, deps, n * sizeof *node->deps);
        node->ndeps = (unsigned)n;
    }
    g->nodes[g->n++] = node;
    return node;
}

EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                                        const CUDA_KERNEL_NODE_PARAMS_v2 *p) {
    if (!out || !g || !p || (!p->func && !p->kern)) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&graph_mu);
    struct sim_node *node = add_node(g, NODE_KERNEL, deps, n);
    if (node) {
        node->k = p->func ? p->func : p->kern;
        unsigned d[6] = {p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX, p->blockDimY, p->blockDimZ};
        memcpy(node->grid, d, sizeof node->grid);
        memcpy(node->block, d + 3, sizeof node->block);
    }
    pthread_mutex_unlock(&graph_mu);
    *out = node;
    return node ? CUDA_SUCCESS : 2;
}
EXPORT CUresult cuGraphAddEmptyNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n) {
    if (!out || !g) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&graph_mu);
    *out = add_node(g, NODE_EMPTY, deps, n);
    pthread_mutex_unlock(&graph_mu);
    return *out ? CUDA_SUCCESS : 2;
}
EXPORT CUresult cuGraphAddChildGraphNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                                         CUgraph child) {
    if (!out || !g || !child) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&graph_mu);
    *out = add_node(g, NODE_CHILD, deps, n);
    if (*out) (*out)->child = child;
    pthread_mutex_unlock(&graph_mu);
    return *out ? CUDA_SUCCESS : 2;
}
/* SIMCUDA_NO_GRAPH_MEMOPS=1: batch mem-op nodes are refused (the shim instantiates without
 * its marks). */
EXPORT CUresult cuGraphAddBatchMemOpNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                                         const CUDA_BATCH_MEM_OP_NODE_PARAMS *p) {
    if (!out || !g || !p || !p->count || !p->paramArray) return CUDA_ERROR_INVALID_VALUE;
    if (getenv("SIMCUDA_NO_GRAPH_MEMOPS")) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < p->count; i++)
        if ((p->paramArray[i].operation != 2 && p->paramArray[i].operation != 5) || !p->paramArray[i].address)
            return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&graph_mu);
    struct sim_node *node = add_node(g, NODE_BATCH_MEM_OP, deps, n);
    if (node) {
        node->ops = malloc(p->count * sizeof *node->ops);
        memcpy(node->ops, p->paramArray, p->count * sizeof *node->ops);
        node->nops = p->count;
    }
    pthread_mutex_unlock(&graph_mu);
    *out = node;
    return node ? CUDA_SUCCESS : 2;
}
EXPORT CUresult cuGraphAddDependencies(CUgraph g, const CUgraphNode *from, const CUgraphNode *to, size_t n) {
    if (!g || (n && (!from || !to))) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&graph_mu);
    for (size_t i = 0; i < n; i++) {
        struct sim_node *t = to[i];
        struct sim_node **deps = realloc(t->deps, (t->ndeps + 1) * sizeof *deps);
        if (!deps) break;
        t->deps = deps;
        t->deps[t->ndeps++] = from[i];
    }
    pthread_mutex_unlock(&graph_mu);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *n) {
    if (!g || !n) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&graph_mu);
    if (nodes)
        for (size_t i = 0; i < *n; i++) nodes[i] = i < g->n ? g->nodes[i] : NULL;
    *n = g->n;
    pthread_mutex_unlock(&graph_mu);
    return CUDA_SUCCESS;
}
/* The CUDA 12 form (what libcuda exports under this name). */
EXPORT CUresult cuGraphGetEdges(CUgraph g, CUgraphNode *from, CUgraphNode *to, size_t *n) {
    if (!g || !n) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&graph_mu);
    size_t e = 0;
    for (unsigned i = 0; i < g->n; i++)
        for (unsigned d = 0; d < g->nodes[i]->ndeps; d++, e++)
            if (from && to && e < *n) { from[e] = g->nodes[i]->deps[d]; to[e] = g->nodes[i]; }
    *n = e;
    pthread_mutex_unlock(&graph_mu);
    return CUDA_SUCCESS;
}
/* CUDA 12.3's form, with each edge's data (all default here). */
EXPORT CUresult cuGraphGetEdges_v2(CUgraph g, CUgraphNode *from, CUgraphNode *to, unsigned char (*data)[8],
                                   size_t *n) {
    size_t cap = n ? *n : 0;
    CUresult r = cuGraphGetEdges(g, from, to, n);
    if (r == CUDA_SUCCESS && data && from)
        for (size_t i = 0; i < cap && i < *n; i++) memset(data[i], 0, 8);
    return r;
}

EXPORT CUresult cuGraphNodeGetType(CUgraphNode n, int *type) {
    if (!n || !type) return CUDA_ERROR_INVALID_VALUE;
    *type = n->type;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode n, CUDA_KERNEL_NODE_PARAMS_v2 *p) {
    if (!n || !p || n->type != NODE_KERNEL) return CUDA_ERROR_INVALID_VALUE;
    memset(p, 0, sizeof *p);
    p->func = n->k;
    p->gridDimX = n->grid[0]; p->gridDimY = n->grid[1]; p->gridDimZ = n->grid[2];
    p->blockDimX = n->block[0]; p->blockDimY = n->block[1]; p->blockDimZ = n->block[2];
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphDestroyNode(CUgraphNode n) {
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&graph_mu);
    struct sim_graph *g = n->g;
    unsigned w = 0;
    for (unsigned i = 0; i < g->n; i++) {
        struct sim_node *o = g->nodes[i];
        if (o == n) continue;
        unsigned dw = 0;
        for (unsigned d = 0; d < o->ndeps; d++)
            if (o->deps[d] != n) o->deps[dw++] = o->deps[d];
        o->ndeps = dw;
        g->nodes[w++] = o;
    }
    g->n = w;
    pthread_mutex_unlock(&graph_mu);
    free(n->deps);
    free(n->ops);
    free(n);
    return CUDA_SUCCESS;
}

/* Appends g's nodes to e in a topological order (Kahn's), child graphs inlined. Among the
 * ready nodes a mem-op node goes first — on a GPU a write runs the moment what it waits for
 * is done, beside the kernels that follow — then the first in node order. Under graph_mu.
 * Returns 0 on a cycle. */
static int flatten(struct sim_exec *e, const struct sim_graph *g) {
    unsigned *indeg = calloc(g->n + 1, sizeof *indeg);
    char *done = calloc(g->n + 1, 1);
    for (unsigned i = 0; i < g->n; i++) indeg[i] = g->nodes[i]->ndeps;
    unsigned placed = 0;
    while (placed < g->n) {
        unsigned i = 0;
        while (i < g->n && (done[i] || indeg[i] || g->nodes[i]->type != NODE_BATCH_MEM_OP)) i++;
        if (i == g->n) {
            i = 0;
            while (i < g->n && (done[i] || indeg[i])) i++;
        }
        if (i == g->n) break;
        done[i] = 1;
        placed++;
        struct sim_node *n = g->nodes[i];
        if (n->type == NODE_CHILD) {
            flatten(e, n->child);
        } else if (n->type != NODE_EMPTY) {
            struct sim_node c = *n;
            c.deps = NULL;
            c.ndeps = 0;
            c.orig = n;
            if (n->nops) {
                c.ops = malloc(n->nops * sizeof *c.ops);
                memcpy(c.ops, n->ops, n->nops * sizeof *c.ops);
            }
            e->nodes = realloc(e->nodes, (e->n + 1) * sizeof *e->nodes);
            e->nodes[e->n++] = c;
        }
        for (unsigned j = 0; j < g->n; j++)
            for (unsigned d = 0; d < g->nodes[j]->ndeps; d++)
                if (g->nodes[j]->deps[d] == n) indeg[j]--;
    }
    free(indeg);
    free(done);
    return placed == g->n;
}

/* SIMCUDA_INSTANTIATE_REFUSES_MEMOPS=1: a graph holding a batch mem-op node is refused at
 * instantiation (a driver that takes the nodes but cannot build them). */
EXPORT HOOKABLE CUresult cuGraphInstantiateWithFlags(CUgraphExec *out, CUgraph g, unsigned long long flags) {
    (void)flags;
    if (!out || !g) return CUDA_ERROR_INVALID_VALUE;
    if (getenv("SIMCUDA_INSTANTIATE_REFUSES_MEMOPS"))
        for (unsigned i = 0; i < g->n; i++)
            if (g->nodes[i]->type == NODE_BATCH_MEM_OP) return CUDA_ERROR_INVALID_VALUE;
    struct sim_exec *e = calloc(1, sizeof *e);
    if (!e) return 2;
    e->magic = SIM_EXEC_MAGIC;
    pthread_mutex_lock(&graph_mu);
    int ok = flatten(e, g);
    pthread_mutex_unlock(&graph_mu);
    if (!ok) { free(e->nodes); free(e); return CUDA_ERROR_INVALID_VALUE; }
    *out = e;
    return CUDA_SUCCESS;
}

static void free_exec_nodes(struct sim_exec *e) {
    for (unsigned i = 0; i < e->n; i++) free(e->nodes[i].ops);
    free(e->nodes);
    e->nodes = NULL;
    e->n = 0;
}

/* Same topology (the flattened node kinds and their mem ops' count): takes the new kernels and
 * dimensions; otherwise fails as the real driver does (topology changed). */
EXPORT HOOKABLE CUresult cuGraphExecUpdate_v2(CUgraphExec ge, CUgraph g, void *info) {
    (void)info;
    struct sim_exec *e = ge, fresh = {SIM_EXEC_MAGIC, 0, NULL};
    if (!e || e->magic != SIM_EXEC_MAGIC || !g) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&graph_mu);
    int ok = flatten(&fresh, g) && fresh.n == e->n;
    for (unsigned i = 0; ok && i < e->n; i++)
        ok = fresh.nodes[i].type == e->nodes[i].type && fresh.nodes[i].nops == e->nodes[i].nops;
    if (ok)
        for (unsigned i = 0; i < e->n; i++) {
            e->nodes[i].k = fresh.nodes[i].k;
            memcpy(e->nodes[i].grid, fresh.nodes[i].grid, sizeof e->nodes[i].grid);
            memcpy(e->nodes[i].block, fresh.nodes[i].block, sizeof e->nodes[i].block);
        }
    pthread_mutex_unlock(&graph_mu);
    free_exec_nodes(&fresh);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
}

/* A kernel node of exec `ge` runs `f` (or `kern`) with these dimensions from its next replay;
 * `node` is the node of the graph it was instantiated from. */
static CUresult set_kernel(CUgraphExec ge, CUgraphNode node, struct sim_kernel *k, const unsigned d[6]) {
    struct sim_exec *e = ge;
    if (!e || e->magic != SIM_EXEC_MAGIC || !node || !k) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&graph_mu);
    for (unsigned i = 0; i < e->n; i++)
        if (e->nodes[i].orig == node && e->nodes[i].type == NODE_KERNEL) {
            e->nodes[i].k = k;
            memcpy(e->nodes[i].grid, d, sizeof e->nodes[i].grid);
            memcpy(e->nodes[i].block, d + 3, sizeof e->nodes[i].block);
            r = CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&graph_mu);
    return r;
}
EXPORT HOOKABLE CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec ge, CUgraphNode node,
                                                            const CUDA_KERNEL_NODE_PARAMS_v2 *p) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    unsigned d[6] = {p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX, p->blockDimY, p->blockDimZ};
    return set_kernel(ge, node, p->func ? (struct sim_kernel *)p->func : (struct sim_kernel *)p->kern, d);
}
/* The CUDA 11 layout: CUDA_KERNEL_NODE_PARAMS without `kern` and `ctx`. */
EXPORT HOOKABLE CUresult cuGraphExecKernelNodeSetParams(CUgraphExec ge, CUgraphNode node,
                                                         const CUDA_KERNEL_NODE_PARAMS_v2 *p) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    unsigned d[6] = {p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX, p->blockDimY, p->blockDimZ};
    return set_kernel(ge, node, (struct sim_kernel *)p->func, d);
}
/* CUgraphNodeParams: the node's type (int), 12 bytes reserved, then the kernel's params (v3,
 * the v2 layout). */
EXPORT HOOKABLE CUresult cuGraphExecNodeSetParams(CUgraphExec ge, CUgraphNode node, const void *params) {
    const int *type = params;
    if (!type || *type != NODE_KERNEL) return CUDA_ERROR_INVALID_VALUE;
    return cuGraphExecKernelNodeSetParams_v2(ge, node, (const CUDA_KERNEL_NODE_PARAMS_v2 *)(type + 4));
}

EXPORT HOOKABLE CUresult cuGraphExecDestroy(CUgraphExec ge) {
    struct sim_exec *e = ge;
    /* Under the lock (a call, so the entry keeps its frame-pointer prologue for the hooks). */
    pthread_mutex_lock(&graph_mu);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (e && e->magic == SIM_EXEC_MAGIC) {
        /* Replays still queued keep pointing at the nodes: the exec is kept, as the real
         * driver defers the destruction until they ran. Tests destroy few. */
        e->magic = 0;
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&graph_mu);
    return r;
}

/* Stream capture: the stream, its graph, the node the next captured launch depends on. */
static struct { CUstream s; struct sim_graph *g; struct sim_node *last; } capturing;

EXPORT HOOKABLE CUresult cuStreamBeginCapture_v2(CUstream s, int mode) {
    (void)mode;
    pthread_mutex_lock(&graph_mu);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (!capturing.g && (capturing.g = calloc(1, sizeof *capturing.g))) {
        capturing.s = s;
        capturing.last = NULL;
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&graph_mu);
    return r;
}

EXPORT HOOKABLE CUresult cuStreamEndCapture(CUstream s, CUgraph *g) {
    pthread_mutex_lock(&graph_mu);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (capturing.g && capturing.s == s && g) {
        *g = capturing.g;
        capturing.g = NULL;
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&graph_mu);
    return r;
}

EXPORT CUresult cuStreamIsCapturing(CUstream s, int *status) {
    pthread_mutex_lock(&graph_mu);
    *status = capturing.g && capturing.s == s; /* CU_STREAM_CAPTURE_STATUS_ACTIVE = 1 */
    pthread_mutex_unlock(&graph_mu);
    return CUDA_SUCCESS;
}

static int capture_add(CUstream s, struct sim_kernel *k, const unsigned grid[3], const unsigned block[3]) {
    pthread_mutex_lock(&graph_mu);
    int captured = capturing.g && capturing.s == s;
    if (captured) {
        struct sim_node *n = add_node(capturing.g, NODE_KERNEL, (const CUgraphNode *)&capturing.last,
                                      capturing.last != NULL);
        if (n) {
            n->k = k;
            memcpy(n->grid, grid, sizeof n->grid);
            memcpy(n->block, block, sizeof n->block);
            capturing.last = n;
        }
    }
    pthread_mutex_unlock(&graph_mu);
    return captured;
}

EXPORT CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned flags) {
    (void)p; (void)n; (void)flags;
    return getenv("SIMCUDA_NO_HOST_REGISTER") ? 2 : CUDA_SUCCESS;
}

static void push_replay(CUstream s, CUgraphExec ge) {
    struct sim_exec *e = ge;
    if (!e || e->magic != SIM_EXEC_MAGIC) return;
    for (unsigned i = 0; i < e->n; i++) {
        const struct sim_node *n = &e->nodes[i];
        if (n->type == NODE_KERNEL)
            push(s, (struct item){n->k, 0, 0, 0, NULL, 0, NULL});
        else if (n->type == NODE_BATCH_MEM_OP)
            push(s, (struct item){&mark_op, 0, 0, 0, NULL, 0, n});
    }
}

/* The GPU thread runs a mem-op node's writes in order. */
static void run_node_ops(const struct sim_node *n) {
    for (unsigned i = 0; i < n->nops; i++) {
        const CUstreamMemOpWrite *op = &n->ops[i];
        if (op->operation == 2)
            atomic_store((_Atomic uint32_t *)(uintptr_t)op->address, (uint32_t)op->value);
        else
            atomic_store((_Atomic uint64_t *)(uintptr_t)op->address, op->value);
    }
}

static _Atomic uint64_t kernels_run, kernels_hash = 0xcbf29ce484222325ull;
static void log_kernel(const struct sim_kernel *k) {
    uint64_t h = atomic_load(&kernels_hash);
    for (const char *c = k->name; *c; c++) h = (h ^ (unsigned char)*c) * 0x100000001b3ull;
    atomic_store(&kernels_hash, h);
    atomic_fetch_add(&kernels_run, 1);
}
EXPORT void simcuda_kernel_log(unsigned long long *count, unsigned long long *hash) {
    *count = atomic_load(&kernels_run);
    *hash = atomic_load(&kernels_hash);
}
