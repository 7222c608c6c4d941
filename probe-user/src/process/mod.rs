//! A target process as /proc and its own memory show it, read without stopping it: its
//! identity and maps (`target`), libcuda's exported entry points (`libcuda`) and code ranges
//! (`code`), return addresses on its stacks (`stackscan`), its Python frames (`pystack`).

pub mod code;
pub mod libcuda;
pub mod ns_tids;
pub mod pystack;
pub mod stackscan;
pub mod target;
