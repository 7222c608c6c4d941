//! `wedgeprobe attach`: the shim put into a running process on the simulated driver — a later
//! wedge named as with a shim started at launch, a hundred attaches killed at random points
//! leaving the target running and correct, and every refusal with its code and its line.
//!
//! The targets run `SIMWORKER_GUARD=1`: a thread waiting in futex with known values in its
//! registers, woken every 10 ms and checking them (the kind of thread an attach takes over);
//! the worker exits 3 if any was changed.

use std::{
    process::Command,
    thread::sleep,
    time::{Duration, Instant},
};

use super::{
    WEDGE_KERNEL, Worker, assert_named_exactly, daemon::Daemon, launch_probes, report_json,
    require_root, secs, shim_path, wait_until, wedgeprobe, wedgeprobe_bin,
};

const GUARD: (&str, &str) = ("SIMWORKER_GUARD", "1");

fn has_shim(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .is_ok_and(|m| m.contains("/memfd:wedgeprobe-shim"))
}

/// Every thread of `pid` runs untraced (none left in a ptrace stop or with a tracer).
fn untraced(pid: u32) -> Result<(), String> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|e| e.to_string())?;
    for t in tasks.flatten() {
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        if field("TracerPid:") != "0" || field("State:").starts_with('t') {
            return Err(format!(
                "thread {:?}: TracerPid {} State {}",
                t.file_name(),
                field("TracerPid:"),
                field("State:")
            ));
        }
    }
    Ok(())
}

/// Waits for the worker and returns its exit code and stdout.
fn finish(w: Worker) -> (Option<i32>, String) {
    let mut w = w;
    let mut out = String::new();
    if let Some(mut s) = w.child.stdout.take() {
        use std::io::Read as _;
        let _ = s.read_to_string(&mut out);
    }
    let status = w.child.wait().ok().and_then(|s| s.code());
    (status, out)
}

/// `wedgeprobe attach` on `w`, which must succeed; its stdout.
fn attach_ok(w: &Worker) -> String {
    let out = wedgeprobe(&["attach", "--pid", &w.pid_arg()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn spawn_guarded(args: &[&str], env: &[(&str, &str)]) -> Worker {
    let mut all = vec![GUARD];
    all.extend_from_slice(env);
    Worker::spawn_piped(args, &all)
}

/// Attached while it launches, the later wedge is named exactly — kernel, grid, the queue
/// behind it — as with the shim loaded at start; the thread taken over comes back intact.
#[test]
fn a_wedge_after_the_attach_is_named_with_its_grid_and_queue() {
    require_root!();
    let w = spawn_guarded(
        &["wedge", "14", "3000"],
        &[("SIMCUDA_RELEASE_AFTER_S", "8")],
    );
    w.wait_for_cuda();
    sleep(secs(0.5));
    let text = attach_ok(&w);
    assert!(text.contains("attached"), "{text}");
    untraced(w.pid()).unwrap();
    // The wedge at 3 s; a report 3 s later.
    sleep(secs(5.0));
    let r = report_json(&["--pid", &w.pid_arg(), "--kernel-floor", "2s"]);
    assert_eq!(r["verdict"]["kind"], "kernel_wedge", "{}", r["verdict"]);
    let head = &r["kernels"][0];
    assert_eq!(head["kernel"], "_Z17attn_wedge_kernelP7barrierPf", "{head}");
    assert_eq!(head["exact"], true, "{head}");
    assert_eq!(head["grid"], serde_json::json!([132, 2, 1]), "{head}");
    assert!(head["queued_behind"].as_u64() > Some(500), "{head}");
    let (code, stdout) = finish(w);
    assert_eq!(code, Some(0), "the worker's guard: {stdout}");
    assert!(stdout.contains("corrupted 0"), "{stdout}");
}

/// On drivers whose launch entry points begin as other builds' do — `endbr64` (CET), a
/// `sub rsp` wrapper with a RIP-relative `lea`, a RIP-relative load then a short branch — the
/// attach moves those instructions (refused on the hand-kept patterns before issue 31), the
/// later wedge is named exactly, and the thread taken over comes back intact.
#[test]
fn attach_hooks_drivers_whose_entry_points_begin_with_other_prologues() {
    require_root!();
    for shape in ["cet", "sub-rsp", "rip-load"] {
        let dir = wp_tests::prologue_dir(shape).display().to_string();
        let w = spawn_guarded(
            &["wedge", "14", "3000"],
            &[("SIMCUDA_RELEASE_AFTER_S", "8"), ("LD_LIBRARY_PATH", &dir)],
        );
        w.wait_for_cuda();
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", w.pid())).unwrap_or_default();
        assert!(
            maps.contains(&dir),
            "{shape}: the worker did not load {dir}"
        );
        sleep(secs(0.5));
        let text = attach_ok(&w);
        assert!(text.contains("attached"), "{shape}: {text}");
        untraced(w.pid()).unwrap();
        sleep(secs(5.0));
        let r = report_json(&["--pid", &w.pid_arg(), "--kernel-floor", "2s"]);
        let head = assert_named_exactly(&r, WEDGE_KERNEL, shape);
        assert_eq!(
            head["grid"],
            serde_json::json!([132, 2, 1]),
            "{shape}: {head}"
        );
        let (code, stdout) = finish(w);
        assert_eq!(code, Some(0), "{shape}: the worker's guard: {stdout}");
        assert!(stdout.contains("corrupted 0"), "{shape}: {stdout}");
    }
}

/// The thread an attach borrows may be idle in any wait a server's threads sit in — a timed
/// futex (relative or until a time), `epoll_wait`, `poll`, `ppoll`, `select`, a `read` on a
/// pipe, `nanosleep`, `clock_nanosleep` until a time — not only an untimed futex (refused on
/// c6de343: "no thread … is idle in a futex wait"). The output names the thread and its wait;
/// the thread comes back with every register and its wait as they were, and never sees EINTR.
#[test]
fn attach_borrows_a_thread_idle_in_any_restartable_wait() {
    require_root!();
    for (kind, says) in [
        ("futex-timed", "a futex wait with a timeout"),
        ("futex-until", "a futex wait until a time"),
        ("epoll", "epoll_wait"),
        ("poll", "from poll"),
        ("ppoll", "ppoll"),
        ("select", "select"),
        ("read", "read on a pipe"),
        ("nanosleep", "nanosleep"),
        ("sleep-until", "clock_nanosleep until a time"),
    ] {
        let w = Worker::spawn_piped(&["loop", "5"], &[("SIMWORKER_GUARD", kind)]);
        w.wait_for_cuda();
        sleep(secs(0.3));
        let text = attach_ok(&w);
        assert!(
            text.contains("(guard), borrowed from") && text.contains(says),
            "{kind}: {text}"
        );
        untraced(w.pid()).unwrap();
        let (code, stdout) = finish(w);
        assert_eq!(code, Some(0), "{kind}: the worker's guard: {stdout}");
        assert!(
            stdout.contains(&format!("guard ({kind})")) && stdout.contains("corrupted 0 eintr 0"),
            "{kind}: {stdout}"
        );
    }
}

/// A hundred attaches SIGKILLed at random points (before, during and after the injection and
/// the patching): each target keeps running, untraced, and finishes with its guard thread's
/// registers intact; a journal left by a shim that loaded says recording or off — never stuck
/// half-attached past the shim's deadline — and is gone once the target exits.
#[test]
fn a_hundred_attaches_killed_at_random_points_leave_the_target_running_and_correct() {
    require_root!();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut done: Vec<Worker> = Vec::new();
    let mut w = spawn_guarded(&["loop", "40"], &[]);
    w.wait_for_cuda();
    let mut per_target = 0;
    let (mut loaded, mut killed_early) = (0, 0);
    let start = Instant::now();
    for i in 0..100 {
        if has_shim(w.pid()) || per_target == 12 {
            loaded += usize::from(has_shim(w.pid()));
            done.push(w);
            w = spawn_guarded(&["loop", "40"], &[]);
            w.wait_for_cuda();
            sleep(secs(0.2));
            per_target = 0;
        }
        per_target += 1;
        let mut attach = Command::new(wedgeprobe_bin())
            .args(["attach", "--pid", &w.pid_arg()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Uniform over 0–600 ms: an attach takes ~200 ms here (longer when a snapshot finds
        // the launcher inside a call and takes the second's worth).
        sleep(Duration::from_micros(next() % 600_000));
        // SAFETY: our own child.
        unsafe { libc::kill(attach.id() as i32, libc::SIGKILL) };
        let status = attach.wait().unwrap();
        killed_early += usize::from(status.code().is_none());
        assert!(
            Path::new(&format!("/proc/{}", w.pid())).exists(),
            "attach {i}: the target died"
        );
        // The kernel detaches a dead tracer's tracees; give it a moment.
        let clean = wait_until(secs(2.0), || untraced(w.pid()).is_ok());
        assert!(clean, "attach {i}: {:?}", untraced(w.pid()));
    }
    done.push(w);
    eprintln!(
        "100 attaches in {:.0} s: {killed_early} killed before they ended, shims loaded in {} \
         targets",
        start.elapsed().as_secs_f64(),
        loaded
    );
    // The shim's deadline (15 s) passes for every half-done attach.
    sleep(secs(16.0));
    for w in &done {
        let pid = w.pid();
        // A journal still mapped (the target may have finished its loop meanwhile).
        if let Ok(m) = std::fs::read_to_string(format!("/proc/{pid}/maps"))
            && m.lines()
                .any(|l| l.ends_with("/memfd:wedgeprobe-journal (deleted)"))
        {
            let out = wedgeprobe(&[
                "report",
                "--json",
                "--pid",
                &pid.to_string(),
                "--window",
                "200ms",
            ]);
            if out.status.code() == Some(6) {
                continue; // it finished its loop meanwhile
            }
            let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            let status = r["targets"][0]["journal"]["status"].as_str().unwrap_or("");
            assert!(
                status == "recording" || status == "shim_off",
                "pid {pid}: journal {status:?}, report exit {:?}: {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    for w in done {
        let pid = w.pid();
        let (code, stdout) = finish(w);
        assert_eq!(code, Some(0), "pid {pid}: {stdout}");
        assert!(stdout.contains("corrupted 0"), "pid {pid}: {stdout}");
    }
}

use std::path::Path;

/// A kernel stuck since before the attach, no thread blocked behind it yet (its launcher
/// paces itself): the attach goes through, and the report names what is stuck as the work
/// queued before the attach — never the first launch the shim saw after it, which waits
/// behind it.
#[test]
fn a_kernel_stuck_before_the_attach_is_never_taken_for_a_later_launch() {
    require_root!();
    let w = spawn_guarded(
        &["wedge", "14", "300"],
        &[
            ("SIMCUDA_RELEASE_AFTER_S", "9"),
            ("SIMWORKER_SYNC_API", "none"),
            ("SIMWORKER_AFTER_WEDGE_US", "20000"),
        ],
    );
    w.wait_for_cuda();
    sleep(secs(1.0));
    attach_ok(&w);
    sleep(secs(3.0));
    let r = report_json(&[
        "--pid",
        &w.pid_arg(),
        "--kernel-floor",
        "1s",
        "--kernel-hard-bound",
        "2s",
    ]);
    let head = &r["kernels"][0];
    assert_eq!(
        head["kernel"], "(work queued before wedgeprobe attached)",
        "{head}"
    );
    assert!(head["queued_behind"].as_u64() > Some(50), "{head}");
    let summary = r["verdict"]["summary"].as_str().unwrap_or("");
    assert!(
        !summary.contains("_Z13decode_kernelPKfPfi")
            && summary.contains("before wedgeprobe attached"),
        "{}",
        r["verdict"]
    );
    let (code, stdout) = finish(w);
    assert_eq!(code, Some(0), "{stdout}");
}

/// A process already blocked inside a launch behind a stuck kernel: refused (exit 11), the
/// thread and the call named; nothing put into it.
#[test]
fn attach_is_refused_on_a_process_blocked_in_a_launch() {
    require_root!();
    let w = spawn_guarded(&["wedge", "10", "300"], &[("SIMCUDA_RELEASE_AFTER_S", "8")]);
    w.wait_for_cuda();
    sleep(secs(1.5));
    let out = wedgeprobe(&["attach", "--pid", &w.pid_arg()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(11), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("inside cuLaunchKernel") || err.contains("inside cuStreamSynchronize"),
        "{err}"
    );
    assert!(!has_shim(w.pid()));
    untraced(w.pid()).unwrap();
}

/// A process that `wedgeprobe watch` already watches has uprobes (int3) on libcuda's entry
/// points, where the hooks go: refused before anything is put in (exit 11), the breakpoints
/// and what to do said in one line; once that watch has ended, the attach goes through.
#[test]
fn attach_is_refused_on_a_process_whose_entry_points_carry_uprobes() {
    require_root!();
    use std::io::{BufRead as _, BufReader};
    let w = spawn_guarded(&["loop", "10"], &[]);
    w.wait_for_cuda();
    let mut watch = Command::new(wedgeprobe_bin())
        .args(["watch", "--pid", &w.pid_arg()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start watch");
    let mut first = String::new();
    BufReader::new(watch.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.contains("watching pid"), "{first}");
    let out = wedgeprobe(&["attach", "--pid", &w.pid_arg()]);
    // Ctrl-C, as a user stops it.
    // SAFETY: a signal to the child this test started.
    unsafe { libc::kill(watch.id() as i32, libc::SIGINT) };
    let _ = watch.wait();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(11), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("carry a breakpoint"), "{err}");
    assert!(!has_shim(w.pid()));
    untraced(w.pid()).unwrap();
    // Once the watch has ended its uprobes go (the kernel takes them out seconds later: the
    // attach waits for that rather than refusing).
    attach_ok(&w);
    assert!(has_shim(w.pid()));
}

/// Refusals, each one line with its code: not a CUDA process (4), already started with the
/// shim (11), without CAP_SYS_PTRACE (5, named), a shim someone else could replace (12).
#[test]
fn attach_refusals_name_the_problem_with_their_exit_codes() {
    require_root!();
    let one_line = |out: &std::process::Output, code: i32, needle: &str| {
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(needle), "{needle}: {err}");
    };
    let mut sleeper = Command::new("sleep").arg("20").spawn().unwrap();
    let out = wedgeprobe(&["attach", "--pid", &sleeper.id().to_string()]);
    one_line(&out, 4, "does not map libcuda");
    let _ = sleeper.kill();
    let _ = sleeper.wait();

    let shim = shim_path();
    let started = spawn_guarded(&["loop", "10"], &[("CUDA_INJECTION64_PATH", &shim)]);
    started.wait_for_cuda();
    sleep(secs(0.3));
    let out = wedgeprobe(&["attach", "--pid", &started.pid_arg()]);
    one_line(&out, 11, "already records");

    let w = spawn_guarded(&["loop", "10"], &[]);
    w.wait_for_cuda();
    let out = Command::new("setpriv")
        .args(["--bounding-set=-sys_ptrace", "--"])
        .arg(wedgeprobe_bin())
        .args(["attach", "--pid", &w.pid_arg()])
        .output()
        .expect("setpriv (util-linux) runs");
    one_line(&out, 5, "CAP_SYS_PTRACE");

    // The binary and its shim in a directory anyone may write to.
    let dir = std::env::temp_dir().join(format!("wp-attach-unsafe-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(wedgeprobe_bin(), dir.join("wedgeprobe")).unwrap();
    std::fs::copy(&shim, dir.join("libcupti_shim.so")).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = Command::new(dir.join("wedgeprobe"))
        .args(["attach", "--pid", &w.pid_arg()])
        .output()
        .unwrap();
    one_line(&out, 12, "not safe to inject");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!has_shim(w.pid()));
}

/// An injected shim gives CUPTI back on `release` as a started one does, and `report` reads
/// its journal (attached late, said so).
#[test]
fn an_injected_shim_is_read_by_report_and_released_by_release() {
    require_root!();
    let w = spawn_guarded(&["loop", "10"], &[]);
    w.wait_for_cuda();
    sleep(secs(0.3));
    attach_ok(&w);
    let r = report_json(&["--pid", &w.pid_arg(), "--window", "300ms"]);
    let t = &r["targets"][0];
    assert_eq!(r["mode"], "journal+ebpf", "{t}");
    assert_eq!(t["journal"]["status"], "recording", "{t}");
    assert_eq!(t["journal"]["attached_late"], true, "{t}");
    let out = wedgeprobe(&["release", "--pid", &w.pid_arg()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("released"), "{text}");
    let (code, stdout) = finish(w);
    assert_eq!(code, Some(0), "{stdout}");
}

/// `inject = true`: the daemon puts the shim into a CUDA process it finds without one, then
/// watches it from its journal, with no launch probe.
#[test]
fn the_daemon_injects_the_shim_when_configured() {
    require_root!();
    let d = Daemon::start("inject", "inject = true\n");
    let w = spawn_guarded(&["loop", "12"], &[]);
    let pid = w.pid();
    d.wait_for(secs(15.0), |e| e["event"] == "injected" && e["pid"] == pid);
    let attached = d.wait_for(secs(10.0), |e| e["event"] == "attached" && e["pid"] == pid);
    assert!(launch_probes(&attached).starts_with("off"), "{attached}");
    let clean = wait_until(secs(2.0), || untraced(pid).is_ok());
    assert!(clean, "{:?}", untraced(pid));
    let (code, stdout) = finish(w);
    assert_eq!(code, Some(0), "{stdout}");
}
