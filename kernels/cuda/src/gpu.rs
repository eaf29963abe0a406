//! The first GPU, with every kernel source compiled for its architecture ([`Gpu::open`]), and
//! kernel launches with their arguments ([`Launch`]). Used by the twin tests; the CUDA executor
//! will build on it.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig};
use cudarc::driver::{DevicePtr, DeviceRepr, PushKernelArg};

use crate::{compile_ptx, Arch, SOURCES};

/// One GPU with the kernels loaded.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// The device's name and compute capability, e.g. `NVIDIA H200 (sm_90)`.
    pub label: String,
    pub arch: Arch,
    /// Every kernel of every source, resolved once.
    functions: Vec<(&'static str, CudaFunction)>,
    _modules: Vec<Arc<CudaModule>>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.label)
    }
}

#[allow(unsafe_code)]
fn driver_probe() -> crate::Probe {
    // SAFETY: only opens the shared library and resolves its symbols; no driver call is made.
    crate::probe_with(|| unsafe { cudarc::driver::sys::is_culib_present() })
}

impl Gpu {
    /// Opens GPU 0 and compiles every source for its architecture with NVRTC.
    ///
    /// # Errors
    /// One line naming what is missing: the driver (`libcuda.so.1`), a GPU, a supported
    /// architecture (`sm_72`, `sm_87`, `sm_90`; the device's is named), NVRTC, or the compile
    /// or load error of a source.
    pub fn open() -> Result<Gpu, String> {
        Gpu::open_with(&|s, arch| compile_ptx(s, arch))
    }

    /// Opens GPU 0 for tests and checks: the PTX read from `$EDGE_CUDA_PTX_DIR`
    /// ([`crate::ptx_from_dir`]) when that is set, else compiled by NVRTC ([`Gpu::open`]).
    ///
    /// # Errors
    /// As [`Gpu::open_with`].
    pub fn open_from_env() -> Result<Gpu, String> {
        match std::env::var_os("EDGE_CUDA_PTX_DIR") {
            Some(dir) => {
                Gpu::open_with(&|s, arch| crate::ptx_from_dir(std::path::Path::new(&dir), s, arch))
            }
            None => Gpu::open(),
        }
    }

    /// For test harnesses: [`Gpu::open_from_env`], or `None` after saying on stderr why the
    /// tests are skipped. With `EDGE_REQUIRE_GPU` set (as `scripts/test-cuda` does on a GPU
    /// machine) a missing GPU is a test failure instead.
    ///
    /// # Panics
    /// When no GPU opens and `EDGE_REQUIRE_GPU` is set.
    pub fn for_tests() -> Option<Gpu> {
        match Gpu::open_from_env() {
            Ok(g) => Some(g),
            Err(e) if std::env::var_os("EDGE_REQUIRE_GPU").is_some() => {
                panic!("EDGE_REQUIRE_GPU is set: {e}")
            }
            Err(e) => {
                eprintln!("skipped (no GPU here): {e}");
                None
            }
        }
    }

    /// Opens GPU 0 and loads every source's PTX as `ptx_of(source, arch)` gives it for the
    /// device's architecture: compiled ahead of time (read from a plan or a folder), so that
    /// nothing is compiled on the device beyond the driver's own PTX assembly.
    ///
    /// # Errors
    /// As [`Gpu::open`], with `ptx_of`'s error for a source it cannot give.
    pub fn open_with(
        ptx_of: &dyn Fn(&crate::Source, Arch) -> Result<String, String>,
    ) -> Result<Gpu, String> {
        match driver_probe() {
            crate::Probe::Usable => {}
            crate::Probe::Missing => return Err("no CUDA driver: libcuda.so.1 was not found (no NVIDIA driver installed, or its folder is not on LD_LIBRARY_PATH)".into()),
            crate::Probe::Incomplete => return Err("the CUDA driver (libcuda.so.1) lacks functions of CUDA 12.6: the driver is too old (JetPack 6 or a driver for CUDA 12.6 and later is needed)".into()),
        }
        let ctx = CudaContext::new(0).map_err(|e| format!("no CUDA GPU: {e}"))?;
        let name = ctx.name().unwrap_or_else(|_| "GPU 0".into());
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| format!("{name}: compute capability: {e}"))?;
        let sm = format!("sm_{major}{minor}");
        let arch = Arch::parse(&sm).map_err(|_| {
            format!("{name} is {sm}; the kernels are built for sm_72, sm_87 and sm_90")
        })?;
        let mut modules = Vec::new();
        let mut functions = Vec::new();
        for s in SOURCES {
            let ptx = ptx_of(&s, arch)?;
            let m = ctx
                .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
                .map_err(|e| format!("{name}: loading {}: {e}", s.name))?;
            for &k in s.kernels {
                let f = m
                    .load_function(k)
                    .map_err(|e| format!("{name}: kernel {k} of {}: {e}", s.name))?;
                functions.push((k, f));
            }
            modules.push(m);
        }
        Ok(Gpu {
            stream: ctx.default_stream(),
            ctx,
            label: format!("{name} ({sm})"),
            arch,
            functions,
            _modules: modules,
        })
    }

    /// Kernel `name` (one of a source's [`crate::Source::kernels`]).
    ///
    /// # Errors
    /// When no loaded source defines it.
    pub fn function(&self, name: &str) -> Result<CudaFunction, String> {
        self.functions
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, f)| f.clone())
            .ok_or_else(|| format!("{}: no kernel {name}", self.label))
    }

    /// Copies `host` to a new device buffer.
    ///
    /// # Errors
    /// The driver's (out of memory, …), naming the device.
    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>, String> {
        self.stream
            .memcpy_stod(host)
            .map_err(|e| format!("{}: upload of {} values: {e}", self.label, host.len()))
    }

    /// A zeroed device buffer of `n` values.
    ///
    /// # Errors
    /// The driver's, naming the device.
    pub fn zeros<T: DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        n: usize,
    ) -> Result<CudaSlice<T>, String> {
        self.stream
            .alloc_zeros(n.max(1))
            .map_err(|e| format!("{}: allocating {n} values: {e}", self.label))
    }

    /// Copies a device buffer back.
    ///
    /// # Errors
    /// The driver's (a failed launch surfaces here), naming the device.
    pub fn download<T: DeviceRepr>(&self, dev: &CudaSlice<T>) -> Result<Vec<T>, String> {
        self.stream
            .memcpy_dtov(dev)
            .map_err(|e| format!("{}: download: {e}", self.label))
    }

    /// A launch of kernel `name` on this GPU's stream.
    ///
    /// # Errors
    /// As [`Gpu::function`].
    pub fn launch(&self, name: &str) -> Result<Launch<'_>, String> {
        Ok(Launch {
            gpu: self,
            name: name.to_string(),
            func: self.function(name)?,
        })
    }

    /// A zeroed device buffer of `bytes` bytes, with its address for kernel arguments
    /// ([`Arg::Ptr`]).
    ///
    /// # Errors
    /// The driver's (out of memory), naming the device and the size.
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer, String> {
        let buf = self
            .stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(|e| format!("{}: allocating {bytes} bytes: {e}", self.label))?;
        let ptr = {
            let (p, _sync) = buf.device_ptr(&self.stream);
            p
        };
        Ok(DeviceBuffer {
            buf,
            ptr,
            len: bytes,
        })
    }

    /// Copies `src` into `dst` at byte `offset`.
    ///
    /// # Errors
    /// A range outside `dst`, or the driver's error, naming the device.
    pub fn write(&self, dst: &mut DeviceBuffer, offset: usize, src: &[u8]) -> Result<(), String> {
        let end = dst.range(offset, src.len())?;
        let mut view = dst.buf.slice_mut(offset..end);
        self.stream.memcpy_htod(src, &mut view).map_err(|e| {
            format!(
                "{}: copy of {} bytes to the GPU: {e}",
                self.label,
                src.len()
            )
        })
    }

    /// Copies `dst.len()` bytes of `src` from byte `offset` into `dst`, waiting for every
    /// earlier launch on the stream (a failed launch surfaces here).
    ///
    /// # Errors
    /// A range outside `src`, or the driver's error, naming the device.
    pub fn read(&self, src: &DeviceBuffer, offset: usize, dst: &mut [u8]) -> Result<(), String> {
        let end = src.range(offset, dst.len())?;
        let view = src.buf.slice(offset..end);
        self.stream
            .memcpy_dtoh(&view, dst)
            .and_then(|_| self.stream.synchronize())
            .map_err(|e| {
                format!(
                    "{}: copy of {} bytes from the GPU: {e}",
                    self.label,
                    dst.len()
                )
            })
    }

    /// Copies `len` bytes of `buf` from byte `from` to byte `to` on the device (ranges must
    /// not overlap).
    ///
    /// # Errors
    /// A range outside `buf` or overlapping ranges, or the driver's error.
    #[allow(unsafe_code)]
    pub fn copy_within(
        &self,
        buf: &mut DeviceBuffer,
        from: usize,
        to: usize,
        len: usize,
    ) -> Result<(), String> {
        let (a, b) = (buf.range(from, len)?, buf.range(to, len)?);
        if from < b && to < a && len > 0 {
            return Err(format!(
                "{}: overlapping device copy {from}..{a} -> {to}..{b}",
                self.label
            ));
        }
        // SAFETY: both ranges lie inside `buf`'s allocation (checked above) and do not overlap;
        // the copy is ordered on this GPU's one stream after every earlier launch.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                buf.ptr + to as u64,
                buf.ptr + from as u64,
                len,
                self.stream.cu_stream(),
            )
        }
        .map_err(|e| format!("{}: device copy of {len} bytes: {e}", self.label))
    }

    /// Waits for every launch and copy on the stream.
    ///
    /// # Errors
    /// The first failed launch's error, naming the device.
    pub fn synchronize(&self) -> Result<(), String> {
        self.stream
            .synchronize()
            .map_err(|e| format!("{}: {e}", self.label))
    }

    /// Free and total device memory in bytes.
    ///
    /// # Errors
    /// The driver's.
    pub fn memory(&self) -> Result<(usize, usize), String> {
        cudarc::driver::result::mem_get_info().map_err(|e| format!("{}: {e}", self.label))
    }

    /// The context (for executors that manage their own streams).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

/// Device memory of one allocation, addressed by byte offsets.
pub struct DeviceBuffer {
    buf: CudaSlice<u8>,
    ptr: u64,
    len: usize,
}

impl DeviceBuffer {
    /// The device address of byte 0 (for [`Arg::Ptr`]).
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The end of `offset..offset + len` when it lies inside the buffer.
    fn range(&self, offset: usize, len: usize) -> Result<usize, String> {
        offset
            .checked_add(len)
            .filter(|&e| e <= self.len)
            .ok_or_else(|| {
                format!(
                    "device range {offset}+{len} outside a {}-byte buffer",
                    self.len
                )
            })
    }
}

/// A kernel about to be launched.
pub struct Launch<'g> {
    gpu: &'g Gpu,
    name: String,
    func: CudaFunction,
}

/// One kernel argument.
pub enum Arg<'a> {
    /// A device buffer of f32.
    F32s(&'a CudaSlice<f32>),
    /// A device buffer of bytes (packed weights, quantized activations).
    Bytes(&'a CudaSlice<u8>),
    /// A null pointer (an absent bias or mask).
    Null,
    /// A device address (a [`DeviceBuffer::ptr`] plus an offset).
    Ptr(u64),
    U64(u64),
    U32(u32),
    I32(i32),
    F32(f32),
}

impl Launch<'_> {
    /// Launches the kernel with `grid × block` threads and `args` in the kernel's parameter order.
    ///
    /// # Safety
    /// `args` must match the kernel's parameters in number, order and type, and every buffer
    /// must be as long as the kernel reads and writes for these arguments and launch size.
    ///
    /// # Errors
    /// The driver's launch error, naming the device and kernel.
    #[allow(unsafe_code)]
    pub unsafe fn run(&self, grid: (u32, u32), block: u32, args: &[Arg<'_>]) -> Result<(), String> {
        let null = 0u64;
        let mut b = self.gpu.stream.launch_builder(&self.func);
        for a in args {
            match a {
                Arg::F32s(s) => b.arg(*s),
                Arg::Bytes(s) => b.arg(*s),
                Arg::Null => b.arg(&null),
                Arg::U64(v) | Arg::Ptr(v) => b.arg(v),
                Arg::U32(v) => b.arg(v),
                Arg::I32(v) => b.arg(v),
                Arg::F32(v) => b.arg(v),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: (grid.0.max(1), grid.1.max(1), 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the caller guarantees the arguments match the kernel and the buffers are
        // long enough; the values pushed live until the launch call returns.
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(|e| format!("{}: launching {}: {e}", self.gpu.label, self.name))
    }
}
