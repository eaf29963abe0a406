//! A plan file changed under a running process (issue 15, defect 8): truncation turns the
//! mapping's SIGBUS into one line and exit status 1; an in-place rewrite is refused before
//! any result is handed out; an exclusive lock held by an updater keeps the plan from being
//! opened; replacing the plan by rename leaves the open plan untouched.

use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use edge_e2e::{compiled_plan, demo};
use edge_runtime::{Error, Plan};

/// Writes the 64×64 demo plan to `dir/name`.
fn plan_file(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(
        &p,
        compiled_plan(&demo("pixart-shapes-64"), &[(64, 64)], None),
    )
    .unwrap();
    p
}

/// The child half of [`truncation_under_a_mapping_is_one_line_and_exit_1`]: opens the plan,
/// truncates the file, then reads a weight through the mapping.
#[test]
fn child_reads_a_truncated_mapping() {
    let Ok(path) = std::env::var("EDGE_GUARD_CHILD_PLAN") else {
        return; // Only meaningful as the child process.
    };
    let plan = Plan::open(Path::new(&path)).expect("open");
    // Digests are checked through the file (not the mapping) before the truncation.
    plan.verify_all_sections()
        .expect("intact before the truncation");
    let last = plan.meta().tensors.len() as u32 - 1;
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(4096).unwrap();
    let bytes = plan.tensor_bytes(last).expect("bytes");
    // Touch every page of the tensor: past the new end of file this faults.
    let sum: u64 = bytes.iter().step_by(512).map(|&b| u64::from(b)).sum();
    println!("read {sum} without a fault");
    std::process::exit(3);
}

#[test]
fn truncation_under_a_mapping_is_one_line_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let path = plan_file(dir.path(), "t.plan");
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_reads_a_truncated_mapping", "--nocapture"])
        .env("EDGE_GUARD_CHILD_PLAN", &path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected exit 1 from the SIGBUS guard; status {:?}, stdout {}, stderr {err}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    let line = err
        .lines()
        .find(|l| l.starts_with("error: plan "))
        .unwrap_or_else(|| panic!("no error line in {err}"));
    assert!(
        line.contains(&path.display().to_string())
            && line.contains("truncated or rewritten in place")
            && line.contains("renaming"),
        "{line}"
    );
}

#[test]
fn an_in_place_rewrite_is_refused_and_a_rename_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let path = plan_file(dir.path(), "r.plan");
    let plan = Plan::open(&path).unwrap();
    plan.check_unchanged().expect("unchanged right after open");

    // Replaced by rename: the open plan still reads its own (old) inode.
    let fresh = plan_file(dir.path(), "new.plan");
    std::fs::rename(&fresh, &path).unwrap();
    plan.check_unchanged()
        .expect("a rename leaves the open file as it was");
    drop(plan);

    // Rewritten in place with the very same bytes (no truncation): still refused.
    let plan = Plan::open(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.write_all(&bytes).unwrap();
    f.sync_all().unwrap();
    let e = plan.check_unchanged().unwrap_err();
    assert!(matches!(e, Error::PlanChanged { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&path.display().to_string()) && msg.contains("changed while in use"),
        "{msg}"
    );
    drop(plan);

    // Truncated before a section's first check: the check names the change, not the digest.
    let plan = Plan::open(&path).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(bytes.len() as u64 / 2)
        .unwrap();
    let last = plan.meta().tensors.len() as u32 - 1;
    let msg = plan.tensor_bytes(last).unwrap_err().to_string();
    assert!(
        msg.contains("changed while in use") && msg.contains("length changed"),
        "{msg}"
    );
    drop(plan);
    std::fs::write(&path, &bytes).unwrap();

    // Appended to: the message says how the length changed.
    let plan = Plan::open(&path).unwrap();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(&[0u8; 8]).unwrap();
    let msg = plan.check_unchanged().unwrap_err().to_string();
    assert!(
        msg.contains(&format!("from {} to {}", bytes.len(), bytes.len() + 8)),
        "{msg}"
    );
}

#[test]
fn an_exclusive_lock_keeps_the_plan_from_being_opened() {
    let dir = tempfile::tempdir().unwrap();
    let path = plan_file(dir.path(), "l.plan");
    let updater = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    updater.lock().unwrap();
    let e = Plan::open(&path).unwrap_err();
    assert!(matches!(e, Error::PlanLocked { .. }), "{e}");
    assert!(e.to_string().contains("locked for writing"), "{e}");
    updater.unlock().unwrap();
    let plan = Plan::open(&path).expect("opens once the updater is done");
    // While the plan is open, an updater's exclusive lock waits (try: would block).
    let again = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    assert!(matches!(
        again.try_lock(),
        Err(std::fs::TryLockError::WouldBlock)
    ));
    drop(plan);
    again.try_lock().expect("free once the plan is closed");
}
