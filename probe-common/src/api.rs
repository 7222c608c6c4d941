//! The CUDA driver entry points wedgeprobe traces, by id.
//!
//! The id travels as the uprobe's attach cookie, so one eBPF program serves every entry point
//! and still knows which one fired. The argument shape (`ArgShape`) tells the eBPF side where
//! the stream and launch dimensions live for that entry point (x86-64 System V: six register
//! arguments, the rest on the stack).

/// How the arguments of an entry point are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ArgShape {
    /// `cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, …)` and the cooperative variant.
    Launch = 0,
    /// `cuLaunchKernelEx(const CUlaunchConfig*, f, …)`.
    LaunchEx = 1,
    /// `cuGraphLaunch(exec, stream)`.
    GraphLaunch = 2,
    /// `cuStreamSynchronize(stream)`.
    StreamSync = 3,
    /// `cuCtxSynchronize(void)`.
    NoArgs = 4,
    /// `cuEventSynchronize(event)`.
    EventSync = 5,
    /// `cuMemcpy*(dst, src, bytes)`.
    Copy3 = 6,
    /// `cuMemcpy2D/3D(const desc*)`, `cuMemcpyPeer(dst, dctx, src, sctx, bytes)`: no size kept.
    CopyOther = 7,
}

/// What kind of wait a call is, for the verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiClass {
    Launch,
    Sync,
    Copy,
    /// CUDA's initialisation and context creation: legitimately seconds long (10–17 s in
    /// PyTorch's `_lazy_init` on the H200 VM), never a wait for a kernel.
    Init,
}

/// `(symbol, shape, class)`, indexed by id.
pub const TABLE: &[(&str, ArgShape, ApiClass)] = &[
    ("cuLaunchKernel", ArgShape::Launch, ApiClass::Launch),
    ("cuLaunchKernel_ptsz", ArgShape::Launch, ApiClass::Launch),
    ("cuLaunchKernelEx", ArgShape::LaunchEx, ApiClass::Launch),
    (
        "cuLaunchKernelEx_ptsz",
        ArgShape::LaunchEx,
        ApiClass::Launch,
    ),
    (
        "cuLaunchCooperativeKernel",
        ArgShape::Launch,
        ApiClass::Launch,
    ),
    (
        "cuLaunchCooperativeKernel_ptsz",
        ArgShape::Launch,
        ApiClass::Launch,
    ),
    ("cuGraphLaunch", ArgShape::GraphLaunch, ApiClass::Launch),
    (
        "cuGraphLaunch_ptsz",
        ArgShape::GraphLaunch,
        ApiClass::Launch,
    ),
    ("cuStreamSynchronize", ArgShape::StreamSync, ApiClass::Sync),
    (
        "cuStreamSynchronize_ptsz",
        ArgShape::StreamSync,
        ApiClass::Sync,
    ),
    ("cuCtxSynchronize", ArgShape::NoArgs, ApiClass::Sync),
    ("cuEventSynchronize", ArgShape::EventSync, ApiClass::Sync),
    ("cuMemcpy", ArgShape::Copy3, ApiClass::Copy),
    ("cuMemcpy_ptds", ArgShape::Copy3, ApiClass::Copy),
    ("cuMemcpyHtoD_v2", ArgShape::Copy3, ApiClass::Copy),
    ("cuMemcpyHtoD_v2_ptds", ArgShape::Copy3, ApiClass::Copy),
    ("cuMemcpyDtoH_v2", ArgShape::Copy3, ApiClass::Copy),
    ("cuMemcpyDtoH_v2_ptds", ArgShape::Copy3, ApiClass::Copy),
    ("cuMemcpyDtoD_v2", ArgShape::Copy3, ApiClass::Copy),
    ("cuMemcpyDtoD_v2_ptds", ArgShape::Copy3, ApiClass::Copy),
    ("cuMemcpy2D_v2", ArgShape::CopyOther, ApiClass::Copy),
    ("cuMemcpy2D_v2_ptds", ArgShape::CopyOther, ApiClass::Copy),
    ("cuMemcpy3D_v2", ArgShape::CopyOther, ApiClass::Copy),
    ("cuMemcpy3D_v2_ptds", ArgShape::CopyOther, ApiClass::Copy),
    ("cuMemcpyPeer", ArgShape::CopyOther, ApiClass::Copy),
    ("cuMemcpyPeer_ptds", ArgShape::CopyOther, ApiClass::Copy),
    // CUDA 12.9+/13: `cuCtxSynchronize_v2(ctx)`; CUDA 13's `cudaDeviceSynchronize` (so
    // `torch.cuda.synchronize()`) waits here, not in `cuCtxSynchronize` (H200, driver 580:
    // reported as "entry point unknown" until it was traced). The context argument is not read.
    ("cuCtxSynchronize_v2", ArgShape::NoArgs, ApiClass::Sync),
    // Traced so that a thread inside them is named, not "entry point unknown": the daemon,
    // attached as PyTorch initialised CUDA on the H200, called a main thread 10–17 s inside
    // `_lazy_init` "blocked in the driver" (2026-12-01). Arguments are not read.
    ("cuInit", ArgShape::NoArgs, ApiClass::Init),
    ("cuDevicePrimaryCtxRetain", ArgShape::NoArgs, ApiClass::Init),
];

/// Number of traced entry points.
pub const COUNT: u32 = TABLE.len() as u32;

/// Name lookups that tell which kernel a `CUfunction` is; traced separately (their own
/// programs) because they are not waits. Cookie values of the name programs.
pub const NAME_MODULE_GET_FUNCTION: u32 = 100;
pub const NAME_LIBRARY_GET_KERNEL: u32 = 101;
pub const NAME_KERNEL_GET_FUNCTION: u32 = 102;
pub const NAME_LOOKUPS: &[(&str, u32)] = &[
    ("cuModuleGetFunction", NAME_MODULE_GET_FUNCTION),
    ("cuLibraryGetKernel", NAME_LIBRARY_GET_KERNEL),
    ("cuKernelGetFunction", NAME_KERNEL_GET_FUNCTION),
];

/// Symbol of an id ("?" for an unknown id: ids come from the kernel side and are checked).
pub fn name(id: u32) -> &'static str {
    match TABLE.get(id as usize) {
        Some((n, _, _)) => n,
        None => "?",
    }
}

pub fn id_of(symbol: &str) -> Option<u32> {
    TABLE
        .iter()
        .position(|(n, _, _)| *n == symbol)
        .map(|i| i as u32)
}

/// The shape of an id; `None` for ids outside the table.
#[inline(always)]
pub fn shape(id: u32) -> Option<ArgShape> {
    // A match instead of a table lookup: the eBPF side calls this and the verifier prefers
    // constants to loads from .rodata.
    Some(match id {
        0 | 1 | 4 | 5 => ArgShape::Launch,
        2 | 3 => ArgShape::LaunchEx,
        6 | 7 => ArgShape::GraphLaunch,
        8 | 9 => ArgShape::StreamSync,
        10 | 26..=28 => ArgShape::NoArgs,
        11 => ArgShape::EventSync,
        12..=19 => ArgShape::Copy3,
        20..=25 => ArgShape::CopyOther,
        _ => return None,
    })
}

pub fn class(id: u32) -> Option<ApiClass> {
    TABLE.get(id as usize).map(|(_, _, c)| *c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_match_agrees_with_table() {
        for (id, (_, s, _)) in TABLE.iter().enumerate() {
            assert_eq!(shape(id as u32), Some(*s), "id {id}");
        }
        assert_eq!(shape(COUNT), None);
    }
}
