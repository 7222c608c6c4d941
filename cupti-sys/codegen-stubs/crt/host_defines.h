/* Stand-in for nvcc's crt/host_defines.h (not in the runtime wheel), just enough for
 * builtin_types.h to parse during `cargo xtask codegen`. Attribute macros expand to nothing
 * or to the plain C attribute: no type changes size or alignment. */
#pragma once
#define __host__
#define __device__
#define __global__
#define __shared__
#define __constant__
#define __managed__
#define __device_builtin__
#define __device_builtin_texture_type__
#define __device_builtin_surface_type__
#define __cudart_builtin__
#define __location__(a)
#define __annotate__(a)
#define __align__(n) __attribute__((aligned(n)))
#define __builtin_align__(n) __attribute__((aligned(n)))
#define __thread__ __thread
#define __import__
#define __export__
#define __cdecl
#define __forceinline__ inline
#define __inline__ inline
#define __specialization_static
#define CUDARTAPI
#define CUDART_CB
#define __dv(v)
#define __CUDA_ALIGN__(n) __attribute__((aligned(n)))
