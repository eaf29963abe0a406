//! CUDA kernels of the edge runtime, as sources compiled ahead of time (issue 16's first step:
//! the sources and their compile-only checks; no executor runs them yet).
//!
//! [`SOURCES`] are the CUDA C files under `src/cu/` (each with the shared header inlined, see
//! [`source`]); [`Arch`] names the targets (`sm_72` Xavier, `sm_87` Orin, `sm_90` data-centre
//! checks). With the `nvrtc` feature, [`compile_ptx`] compiles a source for an architecture
//! with NVRTC (loaded at run time: `libnvrtc.so.12`, e.g. from PyPI's
//! `nvidia-cuda-nvrtc-cu12==12.6.*`, which matches JetPack 6); `scripts/test-cuda
//! --compile-only` compiles every source for every architecture and assembles the PTX with
//! `ptxas -v`, failing on register spills in the matmul and attention kernels.
//!
//! Arithmetic: element-wise kernels and the F32/F16/BF16 and Q8_0 matrix products follow the
//! generic kernels' order with explicit round-to-nearest intrinsics (no contraction into fused
//! multiply-adds except where the generic order has one), so they are meant to give the CPU's
//! bits; norms and attention reduce in a different order (within a bound). None of this has run
//! on a GPU yet: the twin tests need one.
//!
//! Twins (`kernels/generic`): `edge_silu`/`edge_gelu_tanh`/`edge_tanh_k`/`edge_relu`/
//! `edge_scale`/`edge_add`/`edge_mul`/`edge_modulate`/`edge_gated_residual` ↔ the element-wise
//! kernels of the same names; `edge_upsample_nearest2x` ↔ `upsample_nearest2x`;
//! `edge_layer_norm`/`edge_rms_norm`/`edge_group_norm` ↔ `layer_norm`/`rms_norm`/`group_norm`;
//! `edge_linear_plain` ↔ `linear` (F32/F16/BF16); `edge_quantize_q8_0` ↔
//! `quant::quantize_row_q8_0`; `edge_linear_q8_0` ↔ `linear` (Q8_0); `edge_attention` ↔
//! `attention` (head dim ≤ 128; the VAE's single 512-wide head needs another kernel). Not yet
//! written: conv2d (implicit GEMM), the K-quant and Q4_0 products, tensor-core (`mma`) forms,
//! embedding, permute/slice/concat, timestep embedding, T5 position bias.
//!
//! With the `driver` feature, [`gpu`] opens the first GPU, compiles the sources for its
//! architecture and launches kernels (what the twin tests in `tests/twins.rs` use).
//!
//! `unsafe` exists for two concerns: asking whether `libnvrtc.so` and `libcuda.so` load
//! (`nvrtc_loader`, `gpu::driver_present`), and kernel launches (`gpu::Launch::run`), whose
//! argument lists must match the kernels' parameters.
#![deny(unsafe_code)]

/// A GPU architecture a plan can target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Jetson AGX Xavier / Xavier NX (Volta).
    Sm72,
    /// Jetson Orin (Ampere).
    Sm87,
    /// Hopper (H100/H200): checking plans on data-centre GPUs.
    Sm90,
}

impl Arch {
    /// Every architecture, in the order the compile-only check runs them.
    pub const ALL: [Arch; 3] = [Arch::Sm72, Arch::Sm87, Arch::Sm90];

    /// `sm_72`, `sm_87`, `sm_90`.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Sm72 => "sm_72",
            Arch::Sm87 => "sm_87",
            Arch::Sm90 => "sm_90",
        }
    }

    /// The virtual architecture NVRTC compiles PTX for (`compute_72`, …).
    pub fn compute(self) -> &'static str {
        match self {
            Arch::Sm72 => "compute_72",
            Arch::Sm87 => "compute_87",
            Arch::Sm90 => "compute_90",
        }
    }

    /// The architecture named `s` (`sm_87`, `87`, `cuda-sm87`).
    ///
    /// # Errors
    /// A message listing the supported names.
    pub fn parse(s: &str) -> Result<Arch, String> {
        let t = s.strip_prefix("cuda-").unwrap_or(s);
        let t = t
            .strip_prefix("sm_")
            .or_else(|| t.strip_prefix("sm"))
            .unwrap_or(t);
        match t {
            "72" => Ok(Arch::Sm72),
            "87" => Ok(Arch::Sm87),
            "90" => Ok(Arch::Sm90),
            _ => Err(format!(
                "unknown CUDA architecture `{s}` (expected sm_72, sm_87 or sm_90)"
            )),
        }
    }
}

/// The shared device helpers every source includes.
pub const COMMON: &str = include_str!("cu/common.cuh");

/// A kernel source file and the kernels (entry points) it defines.
#[derive(Clone, Copy, Debug)]
pub struct Source {
    /// File name under `src/cu/`.
    pub name: &'static str,
    /// The CUDA C text as written (with its `#include "common.cuh"`).
    pub text: &'static str,
    /// The `extern "C"` entry points.
    pub kernels: &'static [&'static str],
    /// Whether the compile-only check refuses register spills in these kernels (matrix
    /// products and attention, whose speed depends on staying in registers).
    pub no_spills: bool,
}

/// Every kernel source.
pub const SOURCES: [Source; 7] = [
    Source {
        name: "elementwise.cu",
        text: include_str!("cu/elementwise.cu"),
        kernels: &[
            "edge_silu",
            "edge_gelu_tanh",
            "edge_tanh_k",
            "edge_relu",
            "edge_scale",
            "edge_add",
            "edge_mul",
            "edge_modulate",
            "edge_gated_residual",
            "edge_upsample_nearest2x",
            "edge_dequantize",
        ],
        no_spills: false,
    },
    Source {
        name: "norm.cu",
        text: include_str!("cu/norm.cu"),
        kernels: &["edge_layer_norm", "edge_rms_norm", "edge_group_norm"],
        no_spills: false,
    },
    Source {
        name: "linear.cu",
        text: include_str!("cu/linear.cu"),
        kernels: &[
            "edge_linear_plain",
            "edge_quantize_q8_0",
            "edge_linear_q8_0",
        ],
        no_spills: true,
    },
    Source {
        name: "mma.cu",
        text: include_str!("cu/mma.cu"),
        kernels: &[
            "edge_q8_0_split",
            "edge_quantize_q8_0_split",
            "edge_linear_q8_0_mma",
            "edge_linear_f16_mma",
        ],
        no_spills: true,
    },
    Source {
        name: "conv.cu",
        text: include_str!("cu/conv.cu"),
        kernels: &["edge_conv2d"],
        no_spills: true,
    },
    Source {
        name: "flash.cu",
        text: include_str!("cu/flash.cu"),
        kernels: &["edge_attention_mma"],
        no_spills: true,
    },
    Source {
        name: "attention.cu",
        text: include_str!("cu/attention.cu"),
        kernels: &["edge_attention"],
        no_spills: true,
    },
];

/// `s`'s text with `#include "common.cuh"` replaced by [`COMMON`], so NVRTC needs no include
/// path (the text compiled is exactly what the binary holds).
pub fn source(s: &Source) -> String {
    s.text.replace("#include \"common.cuh\"", COMMON)
}

/// BLAKE3 digest of the text [`source`] compiles for `s` (what a plan's module records, so
/// that a runtime refuses PTX made from other sources than its own).
pub fn source_digest(s: &Source) -> [u8; 32] {
    *blake3::hash(source(s).as_bytes()).as_bytes()
}

/// The PTX of source `s` for `arch` from a plan's compiled modules.
///
/// # Errors
/// One line when the plan's kernels are for another architecture than `arch` (the device's),
/// lack `s`, or were compiled from other sources (an edgeplan of another release).
pub fn plan_ptx(
    m: &edge_schema::plan::CudaModules,
    s: &Source,
    arch: Arch,
) -> Result<String, String> {
    if m.arch != arch.name() {
        return Err(format!(
            "the plan's CUDA kernels were compiled for {}, this GPU is {} (compile the plan with --target cuda-{})",
            m.arch,
            arch.name(),
            arch.name().replace('_', "")
        ));
    }
    let module = m
        .modules
        .iter()
        .find(|x| x.name == s.name)
        .ok_or_else(|| format!("the plan has no CUDA module {}", s.name))?;
    if module.source_digest != source_digest(s) {
        return Err(format!(
            "the plan's CUDA module {} was compiled from other sources than this edgerun's (edgeplan and edgerun of different releases): compile the plan again",
            s.name
        ));
    }
    Ok(module.ptx.clone())
}

/// The PTX of source `s` for `arch` from a folder laid out as `scripts/test-cuda
/// --compile-only` writes it: `DIR/ARCH/NAME.ptx` (`sm_90/linear.ptx`).
///
/// # Errors
/// The file's read error, naming it.
pub fn ptx_from_dir(dir: &std::path::Path, s: &Source, arch: Arch) -> Result<String, String> {
    let path = dir.join(arch.name()).join(s.name.replace(".cu", ".ptx"));
    std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Every source compiled for `arch` with NVRTC, as a plan stores them.
///
/// # Errors
/// As [`compile_ptx`].
#[cfg(feature = "nvrtc")]
pub fn compile_modules(arch: Arch) -> Result<edge_schema::plan::CudaModules, String> {
    let modules = SOURCES
        .iter()
        .map(|s| {
            Ok(edge_schema::plan::CudaModule {
                name: s.name.to_string(),
                source_digest: source_digest(s),
                ptx: compile_ptx(s, arch)?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(edge_schema::plan::CudaModules {
        arch: arch.name().to_string(),
        compiler: nvrtc_version(),
        modules,
        vram_budget: None,
        host_stages: Vec::new(),
        device_bytes: 0,
    })
}

/// `NVRTC major.minor` of the loaded library.
#[cfg(feature = "nvrtc")]
fn nvrtc_version() -> String {
    nvrtc_loader::version().map_or_else(|| "NVRTC".to_string(), |(a, b)| format!("NVRTC {a}.{b}"))
}

/// Compiles `s` for `arch` to PTX with NVRTC (`-arch=compute_XX`, no fast-math: IEEE division
/// and square root, denormals kept, no contraction of the explicit intrinsics).
///
/// # Errors
/// NVRTC's log, naming the source; or that `libnvrtc.so` could not be loaded.
#[cfg(feature = "nvrtc")]
pub fn compile_ptx(s: &Source, arch: Arch) -> Result<String, String> {
    match nvrtc_loader::probe() {
        Probe::Usable => {}
        Probe::Missing => return Err("NVRTC not found (libnvrtc.so.12: install nvidia-cuda-nvrtc-cu12==12.6.* and put its lib folder on LD_LIBRARY_PATH)".into()),
        Probe::Incomplete => return Err("the NVRTC found first (libnvrtc.so) lacks functions of NVRTC 12.6 (CUDA 13 removed some): put a folder holding libnvrtc.so -> libnvrtc.so.12 (from nvidia-cuda-nvrtc-cu12==12.6.*) first on LD_LIBRARY_PATH".into()),
    }
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch.compute()),
        options: vec!["--std=c++17".into()],
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(source(s), opts)
        .map(|p| p.to_src())
        .map_err(|e| {
            let why = match &e {
                cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                    let log = log.to_string_lossy();
                    if log.contains("libnvrtc-builtins") {
                        "NVRTC cannot open libnvrtc-builtins.so.12.6: put the folder of libnvrtc.so.12 (which holds it) on LD_LIBRARY_PATH".to_string()
                    } else {
                        log.lines().take(4).collect::<Vec<_>>().join("; ")
                    }
                }
                other => format!("{other:?}"),
            };
            format!("{} for {}: {why}", s.name, arch.name())
        })
}

/// Whether NVRTC can be loaded (and has every function this build calls).
#[cfg(feature = "nvrtc")]
pub fn nvrtc_present() -> bool {
    nvrtc_loader::probe() == Probe::Usable
}

/// What loading a CUDA library found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// It loads with every function of the CUDA 12.6 API this build uses.
    Usable,
    /// No candidate library was found.
    Missing,
    /// A library was found that lacks some of those functions (another CUDA major version, or
    /// a driver older than CUDA 12.6).
    Incomplete,
}

/// Runs `check` (cudarc's `is_culib_present`, which panics instead of failing when a library
/// lacks a symbol it binds) with the panic caught and its message kept off stderr.
pub fn probe_with(check: impl FnOnce() -> bool + std::panic::UnwindSafe) -> Probe {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(check);
    std::panic::set_hook(hook);
    match r {
        Ok(true) => Probe::Usable,
        Ok(false) => Probe::Missing,
        Err(_) => Probe::Incomplete,
    }
}

#[cfg(feature = "driver")]
pub mod gpu;

#[cfg(feature = "nvrtc")]
#[allow(unsafe_code)]
mod nvrtc_loader {
    /// Whether `libnvrtc.so` loads with every symbol (cudarc panics on first use otherwise).
    pub(super) fn probe() -> super::Probe {
        // SAFETY: only tries to open the shared library and resolve its symbols; no NVRTC
        // function is called.
        super::probe_with(|| unsafe { cudarc::nvrtc::sys::is_culib_present() })
    }

    fn present() -> bool {
        probe() == super::Probe::Usable
    }

    /// NVRTC's `(major, minor)` version, if it loads.
    pub(super) fn version() -> Option<(i32, i32)> {
        if !present() {
            return None;
        }
        let (mut major, mut minor) = (0, 0);
        // SAFETY: the library loaded (checked above); nvrtcVersion writes two ints.
        let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
        (r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn architectures_parse_from_their_names() {
        for a in Arch::ALL {
            assert_eq!(Arch::parse(a.name()), Ok(a));
            assert_eq!(
                Arch::parse(&format!("cuda-{}", a.name().replace('_', ""))),
                Ok(a)
            );
        }
        assert!(Arch::parse("sm_80")
            .unwrap_err()
            .contains("sm_72, sm_87 or sm_90"));
        for bad in [
            "cuda-smsm87",
            "cuda-cuda-sm87",
            "cuda- sm87",
            "sm8_7",
            "SM87",
            "",
        ] {
            assert!(Arch::parse(bad).is_err(), "{bad}");
        }
    }

    fn modules(arch: &str) -> edge_schema::plan::CudaModules {
        edge_schema::plan::CudaModules {
            arch: arch.into(),
            compiler: "NVRTC 12.6".into(),
            modules: SOURCES
                .iter()
                .map(|s| edge_schema::plan::CudaModule {
                    name: s.name.into(),
                    source_digest: source_digest(s),
                    ptx: format!("// {}", s.name),
                })
                .collect(),
            vram_budget: None,
            host_stages: Vec::new(),
            device_bytes: 0,
        }
    }

    #[test]
    fn a_plans_kernels_load_only_on_their_architecture_and_from_these_sources() {
        let s = &SOURCES[2];
        let m = modules("sm_87");
        assert_eq!(plan_ptx(&m, s, Arch::Sm87).unwrap(), "// linear.cu");
        let e = plan_ptx(&m, s, Arch::Sm72).unwrap_err();
        assert!(e.contains("compiled for sm_87, this GPU is sm_72"), "{e}");
        assert!(e.contains("--target cuda-sm72"), "{e}");
        let mut other = m.clone();
        other.modules[2].source_digest[0] ^= 1;
        let e = plan_ptx(&other, s, Arch::Sm87).unwrap_err();
        assert!(e.contains("compiled from other sources"), "{e}");
        let mut missing = m;
        missing.modules.remove(2);
        let e = plan_ptx(&missing, s, Arch::Sm87).unwrap_err();
        assert!(e.contains("no CUDA module linear.cu"), "{e}");
    }

    #[test]
    fn source_digests_differ_per_source_and_cover_the_shared_header() {
        let d: Vec<[u8; 32]> = SOURCES.iter().map(source_digest).collect();
        for i in 0..d.len() {
            for j in 0..i {
                assert_ne!(d[i], d[j], "{} and {}", SOURCES[i].name, SOURCES[j].name);
            }
        }
        assert!(source(&SOURCES[0]).contains("edge_exp"));
    }

    #[test]
    fn every_listed_kernel_is_defined_in_its_source() {
        for s in SOURCES {
            assert!(!source(&s).contains("#include"), "{}", s.name);
            for k in s.kernels {
                assert!(
                    s.text.contains(&format!("void {k}(")) || s.text.contains(&format!("\n{k}(")),
                    "{} does not define {k}",
                    s.name
                );
            }
        }
    }
}
