//! The trace export benchmark's workload (`cargo xtask bench trace-export`): N synthetic
//! events — launches and their kernels on 4 streams from 2 threads, PyTorch-like kernel
//! names — pushed through the same path as `wedgeprobe trace` (tick batches, the 1 s
//! reordering window, the streaming writer). Prints one JSON line; the caller measures RSS.
//!
//!   trace_export N OUT.json[.gz]

use std::{sync::Arc, time::Instant};

use probe_user::{
    model::event::{Kernel, Launch, Names, TraceEvent},
    output::trace::chrome::{ChromeTrace, Sorter},
};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().unwrap_or_else(|| "1000000".into()).parse()?;
    let out = args
        .next()
        .unwrap_or_else(|| "/tmp/trace-bench.json.gz".into());
    let names_pool: Vec<Arc<str>> = [
        "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_13BUnaryFunctorIfffNS0_15binary_internal10MulFunctorIfEEEESt5arrayIPcLm2EEEEviT0_T1_",
        "_ZN2at6native18elementwise_kernelILi128ELi2EZNS0_22gpu_kernel_impl_nocastIZZZNS0_23direct_copy_kernel_cudaERNS_18TensorIteratorBaseEENKUlvE1_clEvENKUlvE8_clEvEUlfE_EEvS4_RKT_EUliE_EEviT1_",
        "_Z17attn_fwd_kernelILi128EEvPKfS1_S1_Pfi",
        "triton_poi_fused_add_mul_0",
    ]
    .iter()
    .map(|s| Arc::from(*s))
    .collect();
    let mut names = Names::default();
    names.processes.insert(4242, "python3".into());
    names.threads.insert((4242, 4242), "python3".into());
    names.threads.insert((4242, 4243), "pt_autograd_0".into());
    let start = Instant::now();
    let mut trace = ChromeTrace::create(std::path::Path::new(&out), 0, 0)?;
    let mut sorter = Sorter::new(1_000_000_000);
    // 10 µs between launches; each tick (50 ms) delivers its launches and, ~0.3 s late, the
    // completions of kernels launched earlier (how CUPTI hands them over).
    let mut batch = Vec::new();
    let mut t = 1_000_000_000u64;
    let mut corr = 0u64;
    let mut produced = 0u64;
    while produced < n {
        corr += 1;
        let stream = corr % 4;
        let kernel = names_pool[(corr % 4) as usize].clone();
        batch.push(TraceEvent::Launch(Launch {
            pid: 4242,
            tid: 4242 + (corr % 2) as u32,
            api: "cuLaunchKernel",
            ts_ns: t,
            correlation: corr,
            stream: 0x1000 + stream,
            kernel: kernel.clone(),
            grid: [1024, 1, 1],
            block: [256, 1, 1],
        }));
        batch.push(TraceEvent::Kernel(Kernel {
            pid: 4242,
            device: 0,
            stream: 0x1000 + stream,
            stream_id: 13 + stream as u32,
            correlation: corr,
            kernel,
            start_ns: t + 4_000,
            end_ns: Some(t + 9_000),
            grid: [1024, 1, 1],
            block: [256, 1, 1],
            cluster: [1, 1, 1],
            graph_node: 0,
            queued_behind: None,
        }));
        produced += 2;
        t += 10_000;
        if batch.len() >= 10_000 {
            sorter.push(batch.drain(..));
            for e in sorter.release(t) {
                trace.write(&e, &names)?;
            }
        }
    }
    sorter.push(batch);
    for e in sorter.drain() {
        trace.write(&e, &names)?;
    }
    let events = trace.events;
    let bytes = trace.finish()?;
    println!(
        "{{\"events\": {events}, \"seconds\": {:.3}, \"bytes\": {bytes}, \"out\": \"{out}\"}}",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
