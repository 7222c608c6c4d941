//! The few driver calls the shim makes itself, resolved from the libcuda already loaded in the
//! process (never loading one): the kernel of a graph kernel node that was added explicitly
//! (`cuGraphAddKernelNode`) rather than captured from a launch, whose name no launch callback
//! carried (called from CUPTI's node-created resource callback — graph construction, not the
//! launch path); and the stream progress marks (`crate::marks`, `crate::marks::events`): pinned
//! memory the GPU can write, the stream-ordered write itself, and events.

use std::{
    ffi::{CStr, c_char, c_void},
    sync::OnceLock,
};

use cupti_sys::{CUDA_KERNEL_NODE_PARAMS_v2_st, CUfunction, CUgraphNode, CUkernel};

type GetParams = unsafe extern "C" fn(CUgraphNode, *mut CUDA_KERNEL_NODE_PARAMS_v2_st) -> u32;
type FuncName = unsafe extern "C" fn(*mut *const c_char, CUfunction) -> u32;
type KernelName = unsafe extern "C" fn(*mut *const c_char, CUkernel) -> u32;
pub type HostAlloc = unsafe extern "C" fn(*mut *mut c_void, usize, u32) -> u32;
pub type HostDevicePointer = unsafe extern "C" fn(*mut u64, *mut c_void, u32) -> u32;
/// `cuStreamWriteValue64_v2(stream, addr, value, flags)`.
pub type WriteValue64 = unsafe extern "C" fn(*mut c_void, u64, u64, u32) -> u32;
/// `cuStreamIsCapturing(stream, &status)`: a mark must never be captured into a graph.
pub type IsCapturing = unsafe extern "C" fn(*mut c_void, *mut u32) -> u32;
/// `cuCtxGetDevice(&device)` for the current context.
pub type GraphGetNodes = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut usize) -> u32;
pub type GraphNodeType = unsafe extern "C" fn(*mut c_void, *mut u32) -> u32;
pub type StreamGetId = unsafe extern "C" fn(*mut c_void, *mut u64) -> u32;
pub type CtxGetCurrent = unsafe extern "C" fn(*mut *mut c_void) -> u32;
pub type CtxGetDevice = unsafe extern "C" fn(*mut i32) -> u32;
/// `cuCtxSetCurrent(ctx)`: the flush thread's idle marks run in the stream's context.
pub type CtxSetCurrent = unsafe extern "C" fn(*mut c_void) -> u32;
/// `cuThreadExchangeStreamCaptureMode(&mode)`.
pub type ExchangeCaptureMode = unsafe extern "C" fn(*mut u32) -> u32;
pub type CtxPush = unsafe extern "C" fn(*mut c_void) -> u32;
pub type CtxPop = unsafe extern "C" fn(*mut *mut c_void) -> u32;
/// `cuEventCreate(&event, flags)`, `cuEventRecord(event, stream)`, `cuEventQuery(event)`,
/// `cuEventDestroy_v2(event)`: the stream marks' cheaper primitive (`crate::marks::events`).
pub type EventCreate = unsafe extern "C" fn(*mut *mut c_void, u32) -> u32;
pub type EventRecord = unsafe extern "C" fn(*mut c_void, *mut c_void) -> u32;
pub type EventQuery = unsafe extern "C" fn(*mut c_void) -> u32;
pub type EventDestroy = unsafe extern "C" fn(*mut c_void) -> u32;
/// `cuGraphGetEdges(graph, from, to, &n)` — the CUDA 12 form, which libcuda keeps exporting
/// under this name (CUDA 13's headers map the name to `_v2`, with edge data).
pub type GraphGetEdges =
    unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut *mut c_void, *mut usize) -> u32;
/// `cuGraphGetEdges_v2(graph, from, to, edge_data, &n)` (CUDA 12.3+): the form that lists
/// edges carrying data too (programmatic dependent launch: PyTorch's decode graph on the
/// H100 of 2026-12-07), which the CUDA 12 form refuses (CUDA_ERROR_LOSSY_QUERY).
pub type GraphGetEdgesV2 = unsafe extern "C" fn(
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
    *mut [u8; 8],
    *mut usize,
) -> u32;
/// `cuGraphAddMemsetNode(&node, graph, deps, n, &params, ctx)` (a measurement variant).
pub type GraphAddMemsetNode = unsafe extern "C" fn(
    *mut *mut c_void,
    *mut c_void,
    *const *mut c_void,
    usize,
    *const MemsetParams,
    *mut c_void,
) -> u32;
/// `cuGraphAddEventRecordNode(&node, graph, deps, n, event)` (a measurement variant).
pub type GraphAddEventRecordNode = unsafe extern "C" fn(
    *mut *mut c_void,
    *mut c_void,
    *const *mut c_void,
    usize,
    *mut c_void,
) -> u32;

/// `CUDA_MEMSET_NODE_PARAMS`.
#[repr(C)]
pub struct MemsetParams {
    pub dst: u64,
    pub pitch: usize,
    pub value: u32,
    pub element_size: u32,
    pub width: usize,
    pub height: usize,
}
/// `cuGraphAddDependencies(graph, from, to, n)` (the CUDA 12 form, as above).
pub type GraphAddDependencies =
    unsafe extern "C" fn(*mut c_void, *const *mut c_void, *const *mut c_void, usize) -> u32;
/// `cuGraphRemoveDependencies(graph, from, to, n)` (edges without data).
pub type GraphRemoveDependencies = GraphAddDependencies;
/// `cuGraphAddBatchMemOpNode(&node, graph, deps, n, &params)`.
pub type GraphAddBatchMemOpNode = unsafe extern "C" fn(
    *mut *mut c_void,
    *mut c_void,
    *const *mut c_void,
    usize,
    *const BatchMemOpNodeParams,
) -> u32;
/// `cuGraphDestroyNode(node)`.
pub type GraphDestroyNode = unsafe extern "C" fn(*mut c_void) -> u32;
/// `cuMemHostRegister_v2(p, bytes, flags)`.
pub type HostRegister = unsafe extern "C" fn(*mut c_void, usize, u32) -> u32;

/// `CU_STREAM_MEM_OP_WRITE_VALUE_32`, `_64`.
pub const MEM_OP_WRITE_VALUE_32: u32 = 2;
pub const MEM_OP_WRITE_VALUE_64: u32 = 5;

/// `CUstreamBatchMemOpParams`'s write-value member (cuda.h; the union is 48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct MemOpWrite {
    pub operation: u32,
    pub address: u64,
    pub value: u64,
    pub flags: u32,
    pub alias: u64,
    pub _union_pad: u64,
}
const _: () = assert!(std::mem::size_of::<MemOpWrite>() == 48);

/// `CUDA_BATCH_MEM_OP_NODE_PARAMS` (v1).
#[repr(C)]
pub struct BatchMemOpNodeParams {
    pub ctx: *mut c_void,
    pub count: u32,
    pub ops: *const MemOpWrite,
    pub flags: u32,
}

pub struct Driver {
    get_params: Option<GetParams>,
    pub(crate) func_name: Option<FuncName>,
    pub(crate) kernel_name: Option<KernelName>,
    pub host_alloc: Option<HostAlloc>,
    pub host_device_pointer: Option<HostDevicePointer>,
    pub write_value64: Option<WriteValue64>,
    pub is_capturing: Option<IsCapturing>,
    pub ctx_get_device: Option<CtxGetDevice>,
    pub ctx_get_current: Option<CtxGetCurrent>,
    pub graph_get_nodes: Option<GraphGetNodes>,
    pub graph_node_type: Option<GraphNodeType>,
    pub stream_get_id: Option<StreamGetId>,
    pub ctx_set_current: Option<CtxSetCurrent>,
    pub exchange_capture_mode: Option<ExchangeCaptureMode>,
    pub ctx_push: Option<CtxPush>,
    pub ctx_pop: Option<CtxPop>,
    pub event_create: Option<EventCreate>,
    pub event_record: Option<EventRecord>,
    pub event_query: Option<EventQuery>,
    pub event_destroy: Option<EventDestroy>,
    pub graph_get_edges: Option<GraphGetEdges>,
    pub graph_get_edges_v2: Option<GraphGetEdgesV2>,
    pub graph_add_memset_node: Option<GraphAddMemsetNode>,
    pub graph_add_event_record_node: Option<GraphAddEventRecordNode>,
    pub graph_add_dependencies: Option<GraphAddDependencies>,
    pub graph_remove_dependencies: Option<GraphRemoveDependencies>,
    pub graph_add_batch_mem_op_node: Option<GraphAddBatchMemOpNode>,
    pub graph_destroy_node: Option<GraphDestroyNode>,
    pub host_register: Option<HostRegister>,
}

static DRIVER: OnceLock<Driver> = OnceLock::new();

pub fn driver() -> &'static Driver {
    DRIVER.get_or_init(|| {
        // SAFETY: RTLD_NOLOAD only finds a libcuda the process has loaded already.
        let h = unsafe {
            libc::dlopen(
                c"libcuda.so.1".as_ptr(),
                libc::RTLD_LAZY | libc::RTLD_NOLOAD,
            )
        };
        let sym = |name: &CStr| -> *mut c_void {
            if h.is_null() {
                std::ptr::null_mut()
            } else {
                // SAFETY: a valid handle and a NUL-terminated name.
                unsafe { libc::dlsym(h, name.as_ptr()) }
            }
        };
        // SAFETY: these symbols have these C signatures (cuda.h, CUDA 12.3+); null stays None.
        unsafe {
            Driver {
                get_params: std::mem::transmute::<*mut c_void, Option<GetParams>>(sym(
                    c"cuGraphKernelNodeGetParams_v2",
                )),
                func_name: std::mem::transmute::<*mut c_void, Option<FuncName>>(sym(
                    c"cuFuncGetName",
                )),
                kernel_name: std::mem::transmute::<*mut c_void, Option<KernelName>>(sym(
                    c"cuKernelGetName",
                )),
                host_alloc: std::mem::transmute::<*mut c_void, Option<HostAlloc>>(sym(
                    c"cuMemHostAlloc",
                )),
                host_device_pointer: std::mem::transmute::<*mut c_void, Option<HostDevicePointer>>(
                    sym(c"cuMemHostGetDevicePointer_v2"),
                ),
                // The _v2 entry point works without the legacy stream-memop attribute.
                write_value64: std::mem::transmute::<*mut c_void, Option<WriteValue64>>({
                    let p = sym(c"cuStreamWriteValue64_v2");
                    if p.is_null() {
                        sym(c"cuStreamWriteValue64")
                    } else {
                        p
                    }
                }),
                is_capturing: std::mem::transmute::<*mut c_void, Option<IsCapturing>>(sym(
                    c"cuStreamIsCapturing",
                )),
                ctx_get_device: std::mem::transmute::<*mut c_void, Option<CtxGetDevice>>(sym(
                    c"cuCtxGetDevice",
                )),
                ctx_get_current: std::mem::transmute::<*mut c_void, Option<CtxGetCurrent>>(sym(
                    c"cuCtxGetCurrent",
                )),
                graph_get_nodes: std::mem::transmute::<*mut c_void, Option<GraphGetNodes>>(sym(
                    c"cuGraphGetNodes",
                )),
                graph_node_type: std::mem::transmute::<*mut c_void, Option<GraphNodeType>>(sym(
                    c"cuGraphNodeGetType",
                )),
                stream_get_id: std::mem::transmute::<*mut c_void, Option<StreamGetId>>(sym(
                    c"cuStreamGetId",
                )),
                ctx_set_current: std::mem::transmute::<*mut c_void, Option<CtxSetCurrent>>(sym(
                    c"cuCtxSetCurrent",
                )),
                exchange_capture_mode: std::mem::transmute::<
                    *mut c_void,
                    Option<ExchangeCaptureMode>,
                >(sym(c"cuThreadExchangeStreamCaptureMode")),
                ctx_push: std::mem::transmute::<*mut c_void, Option<CtxPush>>(sym(
                    c"cuCtxPushCurrent_v2",
                )),
                ctx_pop: std::mem::transmute::<*mut c_void, Option<CtxPop>>(sym(
                    c"cuCtxPopCurrent_v2",
                )),
                event_create: std::mem::transmute::<*mut c_void, Option<EventCreate>>(sym(
                    c"cuEventCreate",
                )),
                event_record: std::mem::transmute::<*mut c_void, Option<EventRecord>>(sym(
                    c"cuEventRecord",
                )),
                event_query: std::mem::transmute::<*mut c_void, Option<EventQuery>>(sym(
                    c"cuEventQuery",
                )),
                event_destroy: std::mem::transmute::<*mut c_void, Option<EventDestroy>>(sym(
                    c"cuEventDestroy_v2",
                )),
                graph_get_edges: std::mem::transmute::<*mut c_void, Option<GraphGetEdges>>(sym(
                    c"cuGraphGetEdges",
                )),
                graph_get_edges_v2: std::mem::transmute::<*mut c_void, Option<GraphGetEdgesV2>>(
                    sym(c"cuGraphGetEdges_v2"),
                ),
                graph_add_memset_node: std::mem::transmute::<
                    *mut c_void,
                    Option<GraphAddMemsetNode>,
                >(sym(c"cuGraphAddMemsetNode")),
                graph_add_event_record_node: std::mem::transmute::<
                    *mut c_void,
                    Option<GraphAddEventRecordNode>,
                >(sym(c"cuGraphAddEventRecordNode")),
                graph_add_dependencies: std::mem::transmute::<
                    *mut c_void,
                    Option<GraphAddDependencies>,
                >(sym(c"cuGraphAddDependencies")),
                graph_remove_dependencies: std::mem::transmute::<
                    *mut c_void,
                    Option<GraphRemoveDependencies>,
                >(sym(c"cuGraphRemoveDependencies")),
                graph_add_batch_mem_op_node: std::mem::transmute::<
                    *mut c_void,
                    Option<GraphAddBatchMemOpNode>,
                >(sym(c"cuGraphAddBatchMemOpNode")),
                graph_destroy_node: std::mem::transmute::<*mut c_void, Option<GraphDestroyNode>>(
                    sym(c"cuGraphDestroyNode"),
                ),
                host_register: std::mem::transmute::<*mut c_void, Option<HostRegister>>(sym(
                    c"cuMemHostRegister_v2",
                )),
            }
        }
    })
}

/// The launch dimensions of graph kernel node `node` (zeros when the driver cannot say).
pub fn kernel_node_dims(node: CUgraphNode) -> ([u32; 3], [u32; 3]) {
    let Some(get_params) = driver().get_params else {
        return ([0; 3], [0; 3]);
    };
    // SAFETY: a plain C struct, all-zero is a valid value.
    let mut p: CUDA_KERNEL_NODE_PARAMS_v2_st = unsafe { std::mem::zeroed() };
    // SAFETY: a kernel node handle and an out-struct of the v2 layout.
    if unsafe { get_params(node, &mut p) } != 0 {
        return ([0; 3], [0; 3]);
    }
    (
        [p.gridDimX, p.gridDimY, p.gridDimZ],
        [p.blockDimX, p.blockDimY, p.blockDimZ],
    )
}

/// The mangled kernel name of graph kernel node `node`; "(kernel node)" when the driver
/// cannot say.
pub fn kernel_node_name(node: CUgraphNode) -> Vec<u8> {
    let Some(get_params) = driver().get_params else {
        return UNKNOWN_KERNEL.to_vec();
    };
    // SAFETY: a plain C struct, all-zero is a valid value.
    let mut p: CUDA_KERNEL_NODE_PARAMS_v2_st = unsafe { std::mem::zeroed() };
    // SAFETY: a kernel node handle CUPTI passed and an out-struct of the v2 layout.
    if unsafe { get_params(node, &mut p) } != 0 {
        return UNKNOWN_KERNEL.to_vec();
    }
    kernel_params_name(&p)
}

const UNKNOWN_KERNEL: &[u8] = b"(kernel node)";

/// The mangled name of the kernel kernel-node params `p` name (its `func`, else its `kern`);
/// "(kernel node)" when the driver cannot say.
pub fn kernel_params_name(p: &CUDA_KERNEL_NODE_PARAMS_v2_st) -> Vec<u8> {
    let d = driver();
    let mut name: *const c_char = std::ptr::null();
    // SAFETY: out-pointer; the handles come from the driver (it validates them).
    let ok = unsafe {
        match (d.func_name, d.kernel_name) {
            (Some(f), _) if !p.func.is_null() => f(&mut name, p.func) == 0,
            (_, Some(k)) if !p.kern.is_null() => k(&mut name, p.kern) == 0,
            _ => false,
        }
    };
    if !ok || name.is_null() {
        return UNKNOWN_KERNEL.to_vec();
    }
    // SAFETY: the driver returns a NUL-terminated name it owns.
    unsafe { CStr::from_ptr(name) }.to_bytes().to_vec()
}
