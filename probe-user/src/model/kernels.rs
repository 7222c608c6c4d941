//! Kernels in flight as the model keeps them: each stream's head (its oldest unfinished
//! launch) with what is queued behind it, the candidates it is narrowed to with stream marks,
//! a graph launch's nodes, and the verdict's judgement of it. Built by `journal::heads` from
//! a shim journal, judged by `verdict::kernel`.

use serde::Serialize;

/// One of the launches a stuck kernel is narrowed to (marks mode).
#[derive(Clone, Debug, Serialize)]
pub struct Candidate {
    pub kernel: String,
    pub kernel_demangled: Option<String>,
    pub correlation: u64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub launched_ms_ago: f64,
    /// Graph launches: the executable graph's id (0 otherwise).
    pub graph_exec: u32,
}

/// A graph launch broken down into its kernel nodes.
#[derive(Clone, Debug, Serialize)]
pub struct GraphProgress {
    /// CUPTI's ids of the executable graph launched and of the graph it came from.
    pub exec_id: u32,
    pub graph_id: Option<u32>,
    pub kernel_nodes: usize,
    pub completed: usize,
    /// Kernel nodes with no completion yet, in node order: the first is the one running (or
    /// stuck) when the graph is a chain.
    pub not_completed: Vec<GraphNodeView>,
    /// Whether node progress is known: node completions (the exact mode), or graph marks
    /// (`marks`). Without either only the graph launch's own end is known: every kernel node
    /// is listed, none known done.
    pub node_progress: bool,
    /// Graph marks (the default mode): where the replay running now stands, per branch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub marks: Option<GraphMarkProgress>,
}

/// Where a replay stands by its graph marks: each branch (a chain of kernel nodes, each
/// waiting for the one before) with kernel nodes not known done.
#[derive(Clone, Debug, Serialize)]
pub struct GraphMarkProgress {
    pub branches: Vec<BranchProgress>,
    /// Kernel nodes a mark covers at most (the candidates' bound).
    pub kernels_per_mark: usize,
    /// How long ago the replay last made progress the marks show (a marked kernel node
    /// completed; none yet: the replay began), as the shim's flush thread saw it (±100 ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_progress_ms_ago: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct BranchProgress {
    pub branch: u32,
    pub kernel_nodes: usize,
    /// Kernel nodes of the branch known done in this replay.
    pub done: usize,
    /// The first not known done and the rest of its mark's group: the stuck (or running)
    /// node of the branch is one of them, the first unless it completed since.
    pub candidates: Vec<GraphNodeView>,
    /// One candidate: named exactly.
    pub exact: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct GraphNodeView {
    pub node_id: u64,
    pub kernel: String,
    pub kernel_demangled: Option<String>,
    /// Its place in the graph's launch order (from 1; 0: not known).
    #[serde(skip_serializing_if = "is_zero")]
    pub position: u32,
    #[serde(skip_serializing_if = "is_unknown_dims")]
    pub grid: [u32; 3],
    #[serde(skip_serializing_if = "is_unknown_dims")]
    pub block: [u32; 3],
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

fn is_unknown_dims(d: &[u32; 3]) -> bool {
    *d == [0; 3]
}

/// The head of one stream's queue.
#[derive(Clone, Debug, Serialize)]
pub struct StreamHead {
    pub pid: u32,
    pub device: u32,
    /// `CUstream` as hex.
    pub stream: String,
    pub stream_id: u32,
    pub kernel: String,
    /// The kernel's name demangled (C++ mangled names only).
    pub kernel_demangled: Option<String>,
    pub correlation: u64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub cluster: [u32; 3],
    /// Thread that launched it.
    pub tid: u32,
    pub launched_ms_ago: f64,
    /// Since max(launch, previous kernel's end on the stream): an estimate.
    pub running_ms: f64,
    pub queued_behind: usize,
    /// Graph launches: which kernel nodes have not completed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub graph: Option<GraphProgress>,
    /// Whether `kernel` is the stuck-or-running kernel itself. False (marks mode): the first
    /// unfinished of `candidates` is, and `kernel` says how many there are.
    pub exact: bool,
    /// Marks mode, not exact: the launches from the head to the first mark not yet passed, in
    /// launch order (at most 16; `candidates_total` counts them all).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<Candidate>,
    pub candidates_total: usize,
    /// Marks mode: how long ago the shim last published its marks, when longer than
    /// `journal::heads::MARKS_STALE_MS` — its flush thread is waiting (inside the driver, or
    /// the process is stopped), so marks the GPU passed since may not show: the head is not
    /// named alone and its candidates run to the stream's newest launch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub marks_stale_ms: Option<f64>,
    /// `state` (stuck / suspect / running), `bound_ms`, `collective`: set by the verdict.
    #[serde(flatten)]
    pub judgement: Option<KernelJudgement>,
}

impl StreamHead {
    /// Whether this head is the record an attached shim keeps for its stream's work from
    /// before the attach (`probe_common::journal::PRE_ATTACH_NAME`): no kernel of its own.
    pub fn before_attach(&self) -> bool {
        self.exact && self.kernel.as_bytes() == probe_common::journal::PRE_ATTACH_NAME
    }

    /// The kernel names this head stands for: its candidates, or itself.
    pub fn names(&self) -> Vec<&str> {
        if self.exact {
            vec![self.kernel.as_str()]
        } else {
            self.candidates.iter().map(|c| c.kernel.as_str()).collect()
        }
    }
}

/// What the verdict made of a head (`verdict::kernel::judge`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KernelState {
    /// Within its bounds.
    Running,
    /// Past its bounds, no corroboration yet.
    Suspect,
    /// Past its bounds with host threads blocked behind it, or past the hard bound.
    Stuck,
}

impl KernelState {
    /// The JSON spelling, for text output too.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Suspect => "suspect",
            Self::Stuck => "stuck",
        }
    }
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct KernelJudgement {
    pub state: KernelState,
    /// The bound it was held to, in ms.
    pub bound_ms: f64,
    pub collective: bool,
}

impl StreamHead {
    /// The verdict's state of this head (`Running` before it was judged).
    pub fn state(&self) -> KernelState {
        self.judgement
            .as_ref()
            .map_or(KernelState::Running, |j| j.state)
    }

    pub fn is_stuck(&self) -> bool {
        self.state() == KernelState::Stuck
    }
}

#[cfg(test)]
impl StreamHead {
    /// An exact, unjudged head of `pid`'s one stream (the verdict's unit tests).
    pub fn for_test(pid: u32, kernel: &str, running_ms: f64) -> Self {
        StreamHead {
            pid,
            device: 0,
            stream: "0x1".into(),
            stream_id: 1,
            kernel: kernel.into(),
            kernel_demangled: None,
            correlation: 1,
            grid: [1; 3],
            block: [1; 3],
            cluster: [1; 3],
            tid: pid,
            launched_ms_ago: running_ms,
            running_ms,
            queued_behind: 0,
            graph: None,
            exact: true,
            candidates: Vec::new(),
            candidates_total: 0,
            marks_stale_ms: None,
            judgement: None,
        }
    }
}

/// A C++ mangled kernel name demangled; `None` for names that are not (Triton's, C's).
pub fn demangle(name: &str) -> Option<String> {
    if !name.starts_with("_Z") {
        return None;
    }
    let sym = cpp_demangle::Symbol::new(name).ok()?;
    sym.demangle(&cpp_demangle::DemangleOptions::default()).ok()
}
