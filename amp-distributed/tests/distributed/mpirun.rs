//! The multi-process checks (`examples/mpi_ranks.rs`, built by `cargo test` beside this
//! binary) under `mpirun -np 2 --oversubscribe` on this machine (OpenMPI's launcher).
//! Without `mpirun` on PATH each test prints that it is skipped and passes.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one launch may take before the test calls it hung.
const DEADLINE: Duration = Duration::from_secs(600);

fn mpirun_on_path() -> bool {
    Command::new("mpirun")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `target/<profile>/examples/mpi_ranks`, beside this test binary's `deps/`.
fn ranks_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let bin = dir.join("examples").join("mpi_ranks");
    assert!(
        bin.is_file(),
        "{} is missing: `cargo test -p amp-distributed --features mpi` builds it",
        bin.display()
    );
    bin
}

/// Run `scenario` on 2 ranks: whether mpirun succeeded and everything it printed, or
/// `None` (printed as skipped) without mpirun.
fn launch(scenario: &str, mpirun_args: &[&str]) -> Option<(bool, String)> {
    if !mpirun_on_path() {
        println!("skipped: mpirun is not on PATH (apt-get install openmpi-bin libopenmpi-dev)");
        return None;
    }
    let mut child = Command::new("mpirun")
        .args(["-np", "2", "--oversubscribe", "--allow-run-as-root"])
        .args(mpirun_args)
        .arg(ranks_binary())
        .arg(scenario)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun starts");
    let readers = [
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    ]
    .map(|r| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut r) = r {
                let _ = r.read_to_string(&mut s);
            }
            s
        })
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("mpirun can be waited for") {
            break status;
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("mpirun {scenario} hung for {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out: Vec<String> = readers
        .into_iter()
        .map(|h| h.join().expect("reader"))
        .collect();
    let out = out.concat();
    println!("{out}");
    Some((status.success(), out))
}

fn assert_both_ranks_ok(scenario: &str) {
    let Some((ok, out)) = launch(scenario, &[]) else {
        return;
    };
    assert!(ok, "mpirun {scenario} failed:\n{out}");
    for rank in 0..2 {
        let line = format!("rank {rank}: {scenario} ok");
        assert!(out.contains(&line), "no `{line}` in:\n{out}");
    }
}

#[test]
fn collectives_on_two_ranks() {
    assert_both_ranks_ok("collectives");
}

#[test]
fn two_ranks_on_half_batches_match_one_process_on_the_whole_batch() {
    assert_both_ranks_ok("ddp");
}

#[test]
fn an_inf_on_one_rank_makes_every_rank_skip_and_back_off() {
    assert_both_ranks_ok("scaler");
}

#[test]
fn a_sharded_optimizer_matches_the_replicated_one_bit_for_bit() {
    assert_both_ranks_ok("zero");
}

#[test]
fn a_sharded_optimizer_with_the_sharded_scaler_skips_on_every_rank() {
    assert_both_ranks_ok("zero_scaler");
}

#[test]
fn sharded_and_consolidated_checkpoints_resume_bit_for_bit() {
    assert_both_ranks_ok("zero_checkpoint");
}

#[test]
fn compressed_gradients_stay_within_16_bit_rounding_and_stats_are_sane() {
    assert_both_ranks_ok("compression");
}

/// mpirun tears a job down when a rank exits without finalizing MPI; told not to (as
/// when the launcher does not notice a lost rank), the rank left behind must fail with
/// the timeout error on its own rather than wait forever.
#[test]
fn a_rank_that_leaves_makes_the_other_time_out() {
    let start = Instant::now();
    let Some((_, out)) = launch("dead", &["--mca", "orte_allowed_exit_without_sync", "1"]) else {
        return;
    };
    assert!(out.contains("rank 1: dead ok (leaving)"), "{out}");
    assert!(out.contains("rank 0: dead ok"), "{out}");
    assert!(
        out.contains("all_reduce did not complete within 3s"),
        "{out}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(120),
        "{:?}",
        start.elapsed()
    );
}
