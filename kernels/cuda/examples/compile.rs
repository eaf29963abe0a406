//! Compiles every kernel source with NVRTC: `compile ARCH OUT_DIR` writes `OUT_DIR/NAME.ptx` for
//! each source and `OUT_DIR/manifest.txt`, one line per source: `NAME.ptx NO_SPILLS KERNEL…`
//! (`scripts/test-cuda --compile-only` assembles them with `ptxas -v` and checks the lines).

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(arch), Some(out)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: compile ARCH OUT_DIR (ARCH: sm_72, sm_87 or sm_90)");
        std::process::exit(2);
    };
    let arch = match edge_kernels_cuda::Arch::parse(arch) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let out = std::path::Path::new(out);
    let mut manifest = String::new();
    for s in edge_kernels_cuda::SOURCES {
        match edge_kernels_cuda::compile_ptx(&s, arch) {
            Ok(ptx) => {
                let file = s.name.replace(".cu", ".ptx");
                manifest.push_str(&format!(
                    "{file} {} {}\n",
                    u8::from(s.no_spills),
                    s.kernels.join(" ")
                ));
                let path = out.join(file);
                if let Err(e) = std::fs::write(&path, ptx) {
                    eprintln!("{}: {e}", path.display());
                    std::process::exit(1);
                }
            }
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        }
    }
    let path = out.join("manifest.txt");
    if let Err(e) = std::fs::write(&path, manifest) {
        eprintln!("{}: {e}", path.display());
        std::process::exit(1);
    }
}
