//! CPU feature detection: the one place where the kernel crates, the runtime's plan target
//! check and `edgerun -v` learn what this CPU can run.
//!
//! Features are detected once per process with the standard library's
//! `is_aarch64_feature_detected!` / `is_x86_feature_detected!` (which read `HWCAP` on Linux
//! aarch64 and `cpuid` + `xgetbv` on x86-64, so a feature the OS does not save state for is
//! reported absent). Every other architecture reports none. AMX-INT8, which the standard
//! library does not detect on stable Rust, is read from `cpuid` here; the OS side (`XCR0`,
//! Linux's `ARCH_REQ_XCOMP_PERM`) is `edge_kernels_x86`'s to ask.

use std::sync::OnceLock;

/// The CPU features that select a kernel variant or that a plan can demand. Fields of the other
/// architecture are always `false`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features {
    /// aarch64 Advanced SIMD (part of the aarch64 baseline).
    pub neon: bool,
    /// aarch64 `FEAT_DotProd`: `sdot`/`udot`.
    pub dotprod: bool,
    /// aarch64 `FEAT_I8MM`: `smmla`.
    pub i8mm: bool,
    /// aarch64 `FEAT_FP16`: half-precision arithmetic (reported; no kernel uses it).
    pub fp16: bool,
    /// x86-64 AVX2 (256-bit integer and float vectors).
    pub avx2: bool,
    /// x86-64 FMA3.
    pub fma: bool,
    /// x86-64 F16C (`vcvtph2ps`).
    pub f16c: bool,
    /// x86-64 AVX-512 Foundation.
    pub avx512f: bool,
    /// x86-64 AVX-512 Byte and Word instructions.
    pub avx512bw: bool,
    /// x86-64 AVX-512 Vector Length extensions (EVEX ymm/xmm, 32 vector registers).
    pub avx512vl: bool,
    /// x86-64 AVX-512 VNNI (`vpdpbusd` on zmm).
    pub avx512vnni: bool,
    /// x86-64 AVX-512 BF16 (`vdpbf16ps`).
    pub avx512bf16: bool,
    /// x86-64 AVX-VNNI (VEX `vpdpbusd` on ymm).
    pub avxvnni: bool,
    /// x86-64 AMX-TILE and AMX-INT8 (`tdpbusd`) in `cpuid`; the AMX table also needs the
    /// OS's tile state and Linux's permission (`edge_kernels_x86::amx_granted`).
    pub amxint8: bool,
}

impl Features {
    /// `(name, present)` for every feature of this architecture, names as the standard
    /// library's detection macros spell them (the names plans use in their target).
    pub fn list(&self) -> Vec<(&'static str, bool)> {
        if cfg!(target_arch = "aarch64") {
            vec![
                ("neon", self.neon),
                ("dotprod", self.dotprod),
                ("i8mm", self.i8mm),
                ("fp16", self.fp16),
            ]
        } else if cfg!(target_arch = "x86_64") {
            vec![
                ("avx2", self.avx2),
                ("fma", self.fma),
                ("f16c", self.f16c),
                ("avx512f", self.avx512f),
                ("avx512bw", self.avx512bw),
                ("avx512vl", self.avx512vl),
                ("avx512vnni", self.avx512vnni),
                ("avx512bf16", self.avx512bf16),
                ("avxvnni", self.avxvnni),
                ("amxint8", self.amxint8),
            ]
        } else {
            Vec::new()
        }
    }

    /// Whether this CPU has the feature named `name` (see [`Features::list`]); `None` for a
    /// name this architecture's list does not contain.
    pub fn has(&self, name: &str) -> Option<bool> {
        self.list()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, p)| p)
    }

    /// The present features, space-separated (for logs).
    pub fn summary(&self) -> String {
        let present: Vec<&str> = self
            .list()
            .into_iter()
            .filter(|(_, p)| *p)
            .map(|(n, _)| n)
            .collect();
        if present.is_empty() {
            "baseline".to_string()
        } else {
            present.join(" ")
        }
    }
}

/// This CPU's features, detected on the first call and cached for the process.
pub fn features() -> Features {
    static FEATURES: OnceLock<Features> = OnceLock::new();
    *FEATURES.get_or_init(detect)
}

#[cfg(target_arch = "aarch64")]
fn detect() -> Features {
    use std::arch::is_aarch64_feature_detected as has;
    Features {
        neon: has!("neon"),
        dotprod: has!("dotprod"),
        i8mm: has!("i8mm"),
        fp16: has!("fp16"),
        ..Features::default()
    }
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Features {
    use std::arch::is_x86_feature_detected as has;
    Features {
        avx2: has!("avx2"),
        fma: has!("fma"),
        f16c: has!("f16c"),
        avx512f: has!("avx512f"),
        avx512bw: has!("avx512bw"),
        avx512vl: has!("avx512vl"),
        avx512vnni: has!("avx512vnni"),
        avx512bf16: has!("avx512bf16"),
        avxvnni: has!("avxvnni"),
        amxint8: amx_int8(),
        ..Features::default()
    }
}

/// AMX-TILE and AMX-INT8 in `cpuid` (leaf 7, `edx` bits 24 and 25). Whether the OS saves the
/// tile state and grants it to this process is asked by the kernel crate that uses it
/// (`edge_kernels_x86`), which builds no AMX table without both.
#[cfg(target_arch = "x86_64")]
fn amx_int8() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    __cpuid(0).eax >= 7 && {
        let edx = __cpuid_count(7, 0).edx;
        edx >> 24 & 1 == 1 && edx >> 25 & 1 == 1
    }
}

#[cfg(not(any(target_arch = "aarch64", target_arch = "x86_64")))]
fn detect() -> Features {
    Features::default()
}
