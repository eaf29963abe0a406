//! A write that fails half-way leaves the old file intact and no temporary file behind
//! (`write_atomic`'s whole point; a plain `File::create` would truncate the old file first).
//! The failure is real: a child process (this test binary, re-run) lowers its file-size limit
//! (`RLIMIT_FSIZE`) so that the write fails with `EFBIG` after the first kilobytes.
#![cfg(all(unix, feature = "io"))]

use std::path::Path;
use std::process::Command;

const OLD_LEN: usize = 8192;
const LIMIT: u64 = 4096;

/// The child: limits its file size, then tries to write 64 KiB over the old file.
#[test]
fn child_writes_past_its_file_size_limit() {
    let Ok(path) = std::env::var("EDGE_WRITE_ATOMIC_CHILD") else {
        return; // Only meaningful as the child process.
    };
    // SAFETY: setrlimit and signal with valid arguments; SIGXFSZ is ignored so the failing
    // write returns EFBIG instead of killing the process.
    #[allow(unsafe_code)]
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        let lim = libc::rlimit {
            rlim_cur: LIMIT,
            rlim_max: libc::RLIM_INFINITY,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
    }
    let r = edge_schema::io::write_atomic(Path::new(&path), &vec![b'n'; 65536]);
    match r {
        Err(e) => {
            println!("write failed as it should: {e}");
            std::process::exit(0)
        }
        Ok(()) => {
            println!("the write succeeded past the limit");
            std::process::exit(3)
        }
    }
}

#[test]
fn a_write_failing_half_way_keeps_the_old_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.png");
    std::fs::write(&path, vec![b'o'; OLD_LEN]).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_writes_past_its_file_size_limit",
            "--nocapture",
        ])
        .env("EDGE_WRITE_ATOMIC_CHILD", &path)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "child: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let now = std::fs::read(&path).unwrap();
    assert!(
        now == vec![b'o'; OLD_LEN],
        "the old file was damaged: {} bytes, starts {:?}",
        now.len(),
        &now[..now.len().min(8)]
    );
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(names, ["out.png"], "temporary files left behind");
}
