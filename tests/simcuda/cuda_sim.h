/* The slice of the CUDA driver API the simulated driver implements and the workloads call:
 * the real C types and signatures (what the probe reads registers and stack slots by). */
#ifndef CUDA_SIM_H
#define CUDA_SIM_H
#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct sim_kernel *CUfunction;
typedef struct sim_kernel *CUkernel;
typedef void *CUmodule, *CUlibrary, *CUcontext, *CUevent, *CUgraphExec;
typedef struct sim_stream *CUstream;
typedef unsigned long long CUdeviceptr;
typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned numAttrs;
} CUlaunchConfig;

CUresult cuInit(unsigned flags);
CUresult cuStreamCreate(CUstream *s, unsigned flags);
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name);
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shmem, CUstream s, void **params,
                        void **extra);
CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra);
CUresult cuStreamSynchronize(CUstream s);
CUresult cuCtxSynchronize(void);
CUresult cuCtxSynchronize_v2(CUcontext ctx);
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);

/* CUDA graphs (sim_graph.c): the real layouts of the structs the shim reads or passes. */
typedef struct sim_graph *CUgraph;
typedef struct sim_node *CUgraphNode;
typedef struct {
    CUfunction func;
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void **kernelParams, **extra;
    CUkernel kern;
    CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS_v2;
typedef struct {
    unsigned operation; /* 2: write 32 bits, 5: write 64 bits */
    unsigned long long address, value;
    unsigned flags;
    unsigned long long alias, pad;
} CUstreamMemOpWrite;
typedef struct {
    CUcontext ctx;
    unsigned count;
    const CUstreamMemOpWrite *paramArray;
    unsigned flags;
} CUDA_BATCH_MEM_OP_NODE_PARAMS;
CUresult cuGraphCreate(CUgraph *g, unsigned flags);
CUresult cuGraphAddKernelNode_v2(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                 const CUDA_KERNEL_NODE_PARAMS_v2 *p);
CUresult cuGraphAddEmptyNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t ndeps);
CUresult cuGraphAddChildGraphNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                  CUgraph child);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags);
CUresult cuGraphExecUpdate_v2(CUgraphExec e, CUgraph g, void *info);
CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS_v2 *p);
CUresult cuGraphExecKernelNodeSetParams(CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS_v2 *p);
CUresult cuGraphExecNodeSetParams(CUgraphExec e, CUgraphNode n, const void *params);
CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *n);
CUresult cuGraphExecDestroy(CUgraphExec e);
CUresult cuGraphLaunch(CUgraphExec e, CUstream s);
CUresult cuStreamBeginCapture_v2(CUstream s, int mode);
CUresult cuStreamEndCapture(CUstream s, CUgraph *g);
/* Test control: kernels the "GPU" ran (graph nodes and launches) and an FNV-1a hash of their
 * names in the order run — a graph's "output", compared with and without graph marks. */
void simcuda_kernel_log(unsigned long long *count, unsigned long long *hash);

/* The callbacks an injection library gets from the simulated driver, at the moments CUPTI
 * would call it (cupti-shim/src/backend/sim.rs mirrors these). Api ids are
 * probe_common::api's: their position in its TABLE. */
enum {
    SIM_API_LAUNCH_KERNEL = 0,
    SIM_API_LAUNCH_KERNEL_EX = 2,
    SIM_API_LAUNCH_COOPERATIVE = 4,
    SIM_API_GRAPH_LAUNCH = 6,
    SIM_API_STREAM_SYNCHRONIZE = 8,
    SIM_API_CTX_SYNCHRONIZE = 10,
    SIM_API_EVENT_SYNCHRONIZE = 11,
    SIM_API_MEMCPY = 12,
    SIM_API_MEMCPY_HTOD = 14,
    SIM_API_MEMCPY_DTOH = 16,
    SIM_API_MEMCPY_DTOD = 18,
    SIM_API_CTX_SYNCHRONIZE_V2 = 26,
};
struct simcuda_launch {
    const char *name;
    unsigned long long stream;
    unsigned stream_id, device;
    unsigned grid[3], block[3];
};
struct simcuda_callbacks {
    void (*api_enter)(unsigned api, unsigned long long correlation, const struct simcuda_launch *l);
    void (*api_exit)(unsigned api, unsigned long long correlation);
    void (*kernel_done)(unsigned long long correlation, unsigned long long start_ns,
                        unsigned long long end_ns, unsigned stream_id);
};
void simcuda_subscribe(const struct simcuda_callbacks *cb);
#endif
