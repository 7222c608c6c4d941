//! Entry points and their patching: libcuda's launch entry points (`launch`) and the other calls
//! the shim records without CUPTI (`calls`) are hooked by moving their first instructions to a
//! trampoline (`patch_code`, `install`); `hot` is the one table a hooked launch reads. Above the
//! recorder (`crate::record`) and the marks, below the backends that install them.

pub mod calls;
pub mod coverage;
pub mod hot;
pub mod install;
pub mod launch;
pub mod patch_code;
