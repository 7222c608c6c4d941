//! The few driver calls the shim makes itself, resolved from the libcuda already loaded in the
//! process (never loading one): the kernel of a graph kernel node that was added explicitly
//! (`cuGraphAddKernelNode`) rather than captured from a launch, whose name no launch callback
//! carried. Called from CUPTI's node-created resource callback — graph construction, not the
//! launch path.

use std::{
    ffi::{CStr, c_char, c_void},
    sync::OnceLock,
};

use cupti_sys::{CUDA_KERNEL_NODE_PARAMS_v2_st, CUfunction, CUgraphNode, CUkernel};

type GetParams = unsafe extern "C" fn(CUgraphNode, *mut CUDA_KERNEL_NODE_PARAMS_v2_st) -> u32;
type FuncName = unsafe extern "C" fn(*mut *const c_char, CUfunction) -> u32;
type KernelName = unsafe extern "C" fn(*mut *const c_char, CUkernel) -> u32;

struct Driver {
    get_params: Option<GetParams>,
    func_name: Option<FuncName>,
    kernel_name: Option<KernelName>,
}

static DRIVER: OnceLock<Driver> = OnceLock::new();

fn driver() -> &'static Driver {
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
            }
        }
    })
}

/// The mangled kernel name of graph kernel node `node`; "(kernel node)" when the driver
/// cannot say.
pub fn kernel_node_name(node: CUgraphNode) -> Vec<u8> {
    const UNKNOWN: &[u8] = b"(kernel node)";
    let d = driver();
    let Some(get_params) = d.get_params else {
        return UNKNOWN.to_vec();
    };
    // SAFETY: a plain C struct, all-zero is a valid value.
    let mut p: CUDA_KERNEL_NODE_PARAMS_v2_st = unsafe { std::mem::zeroed() };
    // SAFETY: a kernel node handle CUPTI passed and an out-struct of the v2 layout.
    if unsafe { get_params(node, &mut p) } != 0 {
        return UNKNOWN.to_vec();
    }
    let mut name: *const c_char = std::ptr::null();
    // SAFETY: out-pointer; the handles come from the driver.
    let ok = unsafe {
        match (d.func_name, d.kernel_name) {
            (Some(f), _) if !p.func.is_null() => f(&mut name, p.func) == 0,
            (_, Some(k)) if !p.kern.is_null() => k(&mut name, p.kern) == 0,
            _ => false,
        }
    };
    if !ok || name.is_null() {
        return UNKNOWN.to_vec();
    }
    // SAFETY: the driver returns a NUL-terminated name it owns.
    unsafe { CStr::from_ptr(name) }.to_bytes().to_vec()
}
