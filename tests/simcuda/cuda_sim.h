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
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);
#endif
