//! Host allocations that go back to the system when freed.
//!
//! glibc's `malloc` serves large requests with `mmap` and unmaps them on `free`, but after the
//! first such `free` it raises its mmap threshold to that size (up to 32 MiB) and its trim
//! threshold to twice that, so later buffers below it come from the heap and stay resident
//! after they are freed. A run frees the conditions (tens of MiB) before decoding and the
//! decoder then allocates and frees bands of held rows of many sizes; with the dynamic
//! threshold those fill the heap beyond what is live, past a tight `--max-ram` budget. Setting
//! the threshold explicitly (`mallopt(M_MMAP_THRESHOLD)`, glibc `malloc(3)`) turns the
//! adjustment off: every buffer of at least [`MMAP_THRESHOLD`] bytes is its own mapping and is
//! returned on `free`, so the resident set follows what is live, as the memory model counts it.

/// Buffers of at least this many bytes are mapped on their own and unmapped when freed.
pub const MMAP_THRESHOLD: usize = 1 << 20;

/// Makes large freed buffers go back to the system (see the module docs). Call once at the
/// start of a process that runs under a budget; a no-op off glibc. Returns whether the
/// allocator took the setting.
pub fn return_large_frees() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` only changes allocator tunables; it is thread-safe in glibc and
        // takes plain integers. `M_MMAP_THRESHOLD` accepts values up to 32 MiB on 64-bit.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}
