//! Python stacks of a CPython process, read from its memory without stopping it (py-spy's
//! library in non-blocking mode): "blocked in cuLaunchKernel ← decode_step (model.py:88) ←
//! …" is what tells an on-call engineer which part of vLLM or SGLang is stuck. Read only
//! when a report needs it (a blocked thread, a host stall): attaching costs tens of ms.
//! A process that is not CPython, or a read that races the interpreter, gives no stack.

use std::collections::HashMap;

/// Per OS thread id, the Python frames innermost first as `function (file:line)`.
pub fn stacks(pid: u32) -> Option<HashMap<u32, Vec<String>>> {
    let mut config = py_spy::Config::default();
    config.blocking = py_spy::config::LockingStrategy::NonBlocking;
    let mut spy = py_spy::PythonSpy::new(pid as py_spy::Pid, &config).ok()?;
    let traces = spy.get_stack_traces().ok()?;
    let mut out = HashMap::new();
    for t in traces {
        let Some(tid) = t.os_thread_id else { continue };
        let frames: Vec<String> = t
            .frames
            .iter()
            .take(32)
            .map(|f| {
                let file = f.short_filename.as_deref().unwrap_or(&f.filename);
                format!("{} ({}:{})", f.name, file, f.line)
            })
            .collect();
        out.insert(tid as u32, frames);
    }
    Some(out)
}
