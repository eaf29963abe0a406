//! The CUDA executor's dispatch: which decoded calls have a CUDA kernel ([`gpu_runs`]) and
//! the launch of each, with its argument list, grid and the operands' device addresses.

use edge_kernels::Call;
use edge_kernels_cuda::gpu::Arg;
use edge_schema::op::Epilogue;
use edge_schema::plan::PackLayout;
use edge_schema::DType;

use super::{gpu_err, CudaMath, CudaSession, THREADS};
use crate::error::{Error, Result};
use crate::executor::StageInput;
use crate::session::{Decoded, Operand};

/// Whether `d` runs on the GPU (a CUDA kernel exists for its call and operand types).
pub(super) fn gpu_runs(d: &Decoded) -> bool {
    if d.noop || d.out_dtype != DType::F32 {
        return false;
    }
    match &d.call {
        Call::Linear { weight, k, .. } => {
            let row_major = match d.ins.get(1) {
                Some(Operand::Weight { layout, .. }) => *layout == PackLayout::RowMajor,
                _ => true,
            };
            row_major
                && match weight {
                    DType::F32 | DType::F16 | DType::BF16 => true,
                    DType::Q8_0 => k % 32 == 0,
                    _ => false,
                }
        }
        // bf16 products are a CPU arithmetic (`vdpbf16ps`'s); the planner refuses them for a
        // cuda target, so a plan that has them runs them on the CPU.
        Call::Attention { p, bf16, .. } => !bf16 && p.head_dim <= 128,
        Call::Conv2d { weight, .. } => {
            let row_major = match d.ins.get(1) {
                Some(Operand::Weight { layout, .. }) => *layout == PackLayout::RowMajor,
                _ => true,
            };
            row_major && matches!(weight, DType::F32 | DType::F16 | DType::BF16)
        }
        Call::Rows { dtype, .. } => {
            matches!(dtype, DType::F32 | DType::F16 | DType::BF16 | DType::Q8_0)
        }
        Call::RmsNorm { .. }
        | Call::LayerNorm { .. }
        | Call::GroupNorm { .. }
        | Call::Modulate { .. }
        | Call::GatedResidual { .. }
        | Call::Add
        | Call::Mul
        | Call::Scale { .. }
        | Call::Silu
        | Call::Relu
        | Call::Tanh
        | Call::GeluTanh
        | Call::UpsampleNearest2x { .. }
        | Call::Copy => true,
        _ => false,
    }
}

/// `p.out_hw()` without its panics (the verifier checked the shapes; a hostile plan gets an
/// error).
fn conv_out_hw(p: &edge_kernels::Conv2dParams) -> Result<(usize, usize)> {
    let ph = p.h + p.pad_top + p.pad_bottom;
    let pw = p.w + p.pad_left + p.pad_right;
    if p.stride_h == 0 || p.stride_w == 0 || p.kh == 0 || p.kw == 0 || ph < p.kh || pw < p.kw {
        return Err(Error::Plan(edge_schema::Error::Invalid(format!(
            "conv2d geometry {p:?}"
        ))));
    }
    Ok(((ph - p.kh) / p.stride_h + 1, (pw - p.kw) / p.stride_w + 1))
}

pub(super) fn blocks(n: usize) -> u32 {
    n.div_ceil(THREADS as usize).clamp(1, 65_535) as u32
}

impl CudaSession<'_> {
    /// Bytes of operand 0 of step `i` (a table whose rows a `Rows` step reads).
    fn source_bytes(&self, index: u32, i: usize, bound: &[StageInput<'_>]) -> Result<usize> {
        let plan = self.host.plan;
        Ok(match self.host.decoded[index as usize][i].ins[0] {
            Operand::Arena(s) => s.len as usize,
            Operand::Weight { tensor, .. } => plan.meta().tensors[tensor as usize].len as usize,
            Operand::Input(n) => match bound.get(n as usize) {
                Some(StageInput::F32(x)) => x.len() * 4,
                Some(StageInput::I32(x)) => x.len() * 4,
                Some(StageInput::Bytes(b)) => b.len(),
                None => 0,
            },
        })
    }

    /// Whether stage `index` runs its F16/BF16 products and attention on tensor cores: fast
    /// math, a GPU with them, the denoiser (T5 and the VAE overflow F16), and matrices the plan
    /// stores in a reduced type (F16, BF16, quantized).
    fn fast(&self, index: u32) -> bool {
        self.mma
            && self.math == CudaMath::Fast
            && self.reduced.get(index as usize) == Some(&true)
            && self.host.plan.meta().stages[index as usize].kind
                == edge_schema::plan::StageKind::Denoiser
    }

    /// Launches the CUDA kernel of step `i` (one that [`gpu_runs`]).
    #[allow(unsafe_code)]
    pub(super) fn launch(&mut self, index: u32, i: usize, bound: &[StageInput<'_>]) -> Result<()> {
        let call = self.host.decoded[index as usize][i].call.clone();
        let out_slot = self.host.decoded[index as usize][i].out;
        let out = self.arena.ptr() + out_slot.offset;
        let n_out = out_slot.len as usize / 4;
        let nins = self.host.decoded[index as usize][i].ins.len();
        // A Q8_0 product on tensor cores reads its weight in the split layout.
        let split_q8 = match (&call, self.host.decoded[index as usize][i].ins.get(1)) {
            (
                Call::Linear {
                    weight: DType::Q8_0,
                    n,
                    k: kd,
                    ..
                },
                Some(Operand::Weight { tensor, .. }),
            ) if self.mma => Some((*tensor, *n, *kd)),
            _ => None,
        };
        let mut p = [0u64; 4];
        for (j, slot) in p.iter_mut().enumerate().take(nins) {
            *slot = match split_q8 {
                Some((tensor, n, kd)) if j == 1 => self.split_weight(tensor, n, kd)?,
                _ => self.operand(index, i, j, bound)?,
            };
        }
        let len_of = |j: usize, this: &Self| -> usize {
            match this.host.decoded[index as usize][i].ins[j] {
                Operand::Arena(s) => s.len as usize / 4,
                _ => 0,
            }
        };
        let g = &self.gpu;
        let k = |name: &str| g.launch(name).map_err(gpu_err);
        let u = |v: usize| Arg::U64(v as u64);
        let r = match call {
            Call::Linear {
                m,
                k: kd,
                n,
                weight,
                bias,
                epilogue,
            } => {
                let b = if bias { Arg::Ptr(p[2]) } else { Arg::Null };
                let product = if weight == DType::Q8_0 && split_q8.is_some() {
                    let nb = kd / 32;
                    let (xq, xd) = (self.qx.ptr(), self.qx.ptr() + (m * kd) as u64);
                    let (wq, wd) = (p[1], p[1] + (n * kd) as u64);
                    // SAFETY: (x, qs, d, blocks): x holds m·k f32 at p[0]; qx m·k quants then
                    // m·nb scales (sized for the largest Q8_0 product at creation).
                    unsafe {
                        k("edge_quantize_q8_0_split")?.run(
                            (blocks(m * nb), 1),
                            THREADS,
                            &[Arg::Ptr(p[0]), Arg::Ptr(xq), Arg::Ptr(xd), u(m * nb)],
                        )
                    }
                    .map_err(gpu_err)?;
                    // SAFETY: (xq, xd, wq, wd, bias, out, m, k, n): the split weight holds n·k
                    // quants and n·nb scales, bias n and out m·n values.
                    unsafe {
                        k("edge_linear_q8_0_mma")?.run(
                            (n.div_ceil(128) as u32, m.div_ceil(128) as u32),
                            256,
                            &[
                                Arg::Ptr(xq),
                                Arg::Ptr(xd),
                                Arg::Ptr(wq),
                                Arg::Ptr(wd),
                                b,
                                Arg::Ptr(out),
                                u(m),
                                u(kd),
                                u(n),
                            ],
                        )
                    }
                } else if weight == DType::Q8_0 {
                    let nb = kd / 32;
                    // SAFETY: (x, q, blocks): x holds m·k f32 at p[0], qx m·nb blocks of 34
                    // bytes (sized for the largest Q8_0 product at creation).
                    unsafe {
                        k("edge_quantize_q8_0")?.run(
                            (blocks(m * nb), 1),
                            THREADS,
                            &[Arg::Ptr(p[0]), Arg::Ptr(self.qx.ptr()), u(m * nb)],
                        )
                    }
                    .map_err(gpu_err)?;
                    // SAFETY: (xq, w, bias, out, m, k, n): the Q8_0 weight holds n·nb blocks,
                    // bias n and out m·n values (the plan's verified shapes).
                    unsafe {
                        k("edge_linear_q8_0")?.run(
                            (n.div_ceil(64) as u32, m.div_ceil(4) as u32),
                            256,
                            &[
                                Arg::Ptr(self.qx.ptr()),
                                Arg::Ptr(p[1]),
                                b,
                                Arg::Ptr(out),
                                u(m),
                                u(kd),
                                u(n),
                            ],
                        )
                    }
                } else {
                    let code = match weight {
                        DType::F16 => 1,
                        DType::BF16 => 2,
                        _ => 0,
                    };
                    let fast = code != 0 && self.fast(index);
                    let (name, tile) = if fast {
                        ("edge_linear_f16_mma", 128)
                    } else {
                        ("edge_linear_plain", 64)
                    };
                    // SAFETY: (x, w, dtype, bias, out, m, k, n): x m·k f32, w n·k of `weight`,
                    // bias n, out m·n (the plan's verified shapes); both kernels take these.
                    unsafe {
                        k(name)?.run(
                            (n.div_ceil(tile) as u32, m.div_ceil(tile) as u32),
                            256,
                            &[
                                Arg::Ptr(p[0]),
                                Arg::Ptr(p[1]),
                                Arg::I32(code),
                                b,
                                Arg::Ptr(out),
                                u(m),
                                u(kd),
                                u(n),
                            ],
                        )
                    }
                };
                match (product, epilogue) {
                    // The fused GELU: the element-wise kernel (the CPU's bits) over the output
                    // in place, after the product on the same stream.
                    // SAFETY: (x, out, n): out holds m·n values; each thread reads and writes
                    // its own elements, so x = out is allowed.
                    (Ok(()), Epilogue::GeluTanh) => unsafe {
                        k("edge_gelu_tanh")?.run(
                            (blocks(m * n), 1),
                            THREADS,
                            &[Arg::Ptr(out), Arg::Ptr(out), u(m * n)],
                        )
                    },
                    (r, _) => r,
                }
            }
            Call::RmsNorm { rows, dim, eps } => {
                // SAFETY: (x, weight, out, d, eps): rows blocks over rows·dim values.
                unsafe {
                    k("edge_rms_norm")?.run(
                        (rows as u32, 1),
                        THREADS,
                        &[
                            Arg::Ptr(p[0]),
                            Arg::Ptr(p[1]),
                            Arg::Ptr(out),
                            u(dim),
                            Arg::F32(eps),
                        ],
                    )
                }
            }
            Call::LayerNorm {
                rows,
                dim,
                eps,
                affine,
            } => {
                let (w, b) = if affine {
                    (Arg::Ptr(p[1]), Arg::Ptr(p[2]))
                } else {
                    (Arg::Null, Arg::Null)
                };
                // SAFETY: (x, weight, bias, out, d, eps): rows blocks over rows·dim values.
                unsafe {
                    k("edge_layer_norm")?.run(
                        (rows as u32, 1),
                        THREADS,
                        &[Arg::Ptr(p[0]), w, b, Arg::Ptr(out), u(dim), Arg::F32(eps)],
                    )
                }
            }
            Call::GroupNorm {
                channels,
                hw,
                groups,
                eps,
            } => {
                // SAFETY: (x, weight, bias, out, c, hw, groups, eps): one block per group over
                // channels·hw values, weight and bias of `channels`.
                unsafe {
                    k("edge_group_norm")?.run(
                        (groups as u32, 1),
                        THREADS,
                        &[
                            Arg::Ptr(p[0]),
                            Arg::Ptr(p[1]),
                            Arg::Ptr(p[2]),
                            Arg::Ptr(out),
                            u(channels),
                            u(hw),
                            u(groups),
                            Arg::F32(eps),
                        ],
                    )
                }
            }
            Call::Modulate {
                rows,
                dim,
                shift_row,
                scale_row,
            } => {
                // SAFETY: (x, shift, scale, out, m, d): the shift and scale rows lie inside
                // input 1 (decoded from its shape), x and out hold rows·dim values.
                unsafe {
                    k("edge_modulate")?.run(
                        (blocks(rows * dim), 1),
                        THREADS,
                        &[
                            Arg::Ptr(p[0]),
                            Arg::Ptr(p[1] + (shift_row * dim * 4) as u64),
                            Arg::Ptr(p[1] + (scale_row * dim * 4) as u64),
                            Arg::Ptr(out),
                            u(rows),
                            u(dim),
                        ],
                    )
                }
            }
            Call::GatedResidual {
                rows,
                dim,
                gate_row,
            } => {
                // SAFETY: (x, y, gate, out, m, d): the gate row lies inside input 2.
                unsafe {
                    k("edge_gated_residual")?.run(
                        (blocks(rows * dim), 1),
                        THREADS,
                        &[
                            Arg::Ptr(p[0]),
                            Arg::Ptr(p[1]),
                            Arg::Ptr(p[2] + (gate_row * dim * 4) as u64),
                            Arg::Ptr(out),
                            u(rows),
                            u(dim),
                        ],
                    )
                }
            }
            Call::Add | Call::Mul => {
                let nb = match self.host.decoded[index as usize][i].ins[1] {
                    Operand::Arena(s) => s.len as usize / 4,
                    Operand::Weight { tensor, .. } => {
                        self.host.plan.meta().tensors[tensor as usize].len as usize / 4
                    }
                    Operand::Input(_) => n_out,
                };
                let name = if matches!(call, Call::Add) {
                    "edge_add"
                } else {
                    "edge_mul"
                };
                if nb == 0 || !n_out.is_multiple_of(nb) {
                    return Err(Error::Gpu(format!(
                        "{name}: {n_out} values with {nb} broadcast"
                    )));
                }
                // SAFETY: (a, b, out, n, nb): a and out hold n values, b nb with n % nb == 0.
                unsafe {
                    k(name)?.run(
                        (blocks(n_out), 1),
                        THREADS,
                        &[
                            Arg::Ptr(p[0]),
                            Arg::Ptr(p[1]),
                            Arg::Ptr(out),
                            u(n_out),
                            u(nb),
                        ],
                    )
                }
            }
            Call::Scale { factor } => {
                // SAFETY: (x, factor, out, n): x and out hold n values.
                unsafe {
                    k("edge_scale")?.run(
                        (blocks(n_out), 1),
                        THREADS,
                        &[Arg::Ptr(p[0]), Arg::F32(factor), Arg::Ptr(out), u(n_out)],
                    )
                }
            }
            Call::Silu | Call::Relu | Call::Tanh | Call::GeluTanh => {
                let name = match call {
                    Call::Silu => "edge_silu",
                    Call::Relu => "edge_relu",
                    Call::Tanh => "edge_tanh_k",
                    _ => "edge_gelu_tanh",
                };
                // SAFETY: (x, out, n): x and out hold n values.
                unsafe {
                    k(name)?.run(
                        (blocks(n_out), 1),
                        THREADS,
                        &[Arg::Ptr(p[0]), Arg::Ptr(out), u(n_out)],
                    )
                }
            }
            Call::Attention {
                p: a, mask, bias, ..
            } => {
                let m = if mask { Arg::Ptr(p[2]) } else { Arg::Null };
                let b = if bias {
                    Arg::Ptr(p[2 + usize::from(mask)])
                } else {
                    Arg::Null
                };
                let warps = a.lq * a.heads;
                let (name, grid) = if self.fast(index) && a.head_dim <= 80 {
                    ("edge_attention_mma", (a.lq.div_ceil(64), a.heads))
                } else {
                    ("edge_attention", (warps.div_ceil(4), 1))
                };
                // SAFETY: edge_attention's and edge_attention_mma's argument list (one warp per
                // (query row, head), four per block; or 64 query rows of one head per block);
                // strides and offsets from the verified attention parameters.
                unsafe {
                    k(name)?.run(
                        (grid.0 as u32, grid.1 as u32),
                        128,
                        &[
                            Arg::Ptr(p[0]),
                            Arg::Ptr(p[1]),
                            m,
                            b,
                            Arg::Ptr(out),
                            u(a.lq),
                            u(a.lk),
                            Arg::U32(a.heads as u32),
                            Arg::U32(a.head_dim as u32),
                            Arg::F32(a.scale),
                            u(a.q_stride),
                            u(a.q_offset),
                            u(a.kv_stride),
                            u(a.k_offset),
                            u(a.v_offset),
                            Arg::F32(a.masked_value),
                        ],
                    )
                }
            }
            Call::Conv2d { p: c, weight, bias } => {
                let code = match weight {
                    DType::F16 => 1,
                    DType::BF16 => 2,
                    _ => 0,
                };
                let (oh, ow) = conv_out_hw(&c)?;
                let b = if bias { Arg::Ptr(p[2]) } else { Arg::Null };
                let v = |x: usize| Arg::U32(x as u32);
                // SAFETY: edge_conv2d's argument list; x holds cin·h·w values, the weight
                // cout·cin·kh·kw of `weight`, bias cout, out cout·oh·ow (verified shapes); 64 × 64
                // outputs per block of 256 threads.
                unsafe {
                    k("edge_conv2d")?.run(
                        ((oh * ow).div_ceil(64) as u32, c.cout.div_ceil(64) as u32),
                        256,
                        &[
                            Arg::Ptr(p[0]),
                            Arg::Ptr(p[1]),
                            Arg::I32(code),
                            b,
                            Arg::Ptr(out),
                            v(c.cin),
                            v(c.h),
                            v(c.w),
                            v(c.cout),
                            v(c.kh),
                            v(c.kw),
                            v(c.stride_h),
                            v(c.stride_w),
                            v(c.pad_top),
                            v(c.pad_left),
                            v(oh),
                            v(ow),
                        ],
                    )
                }
            }
            Call::Rows {
                dtype,
                row_bytes,
                start,
                len,
            } => {
                let have = self.source_bytes(index, i, bound)?;
                if (start + len) * row_bytes > have {
                    return Err(Error::Plan(edge_schema::Error::Invalid(format!(
                        "rows {start}..{} outside their table",
                        start + len
                    ))));
                }
                let code = match dtype {
                    DType::F16 => 1,
                    DType::BF16 => 2,
                    DType::Q8_0 => 3,
                    _ => 0,
                };
                // SAFETY: (src, dtype, out, n): the rows lie inside the source (checked above)
                // and hold n_out values of `dtype`; out holds n_out f32.
                unsafe {
                    k("edge_dequantize")?.run(
                        (blocks(n_out), 1),
                        THREADS,
                        &[
                            Arg::Ptr(p[0] + (start * row_bytes) as u64),
                            Arg::I32(code),
                            Arg::Ptr(out),
                            u(n_out),
                        ],
                    )
                }
            }
            Call::UpsampleNearest2x { channels, h, w } => {
                // SAFETY: (x, out, c, h, w): x holds c·h·w values, out 4·c·h·w.
                unsafe {
                    k("edge_upsample_nearest2x")?.run(
                        (blocks(4 * channels * h * w), 1),
                        THREADS,
                        &[Arg::Ptr(p[0]), Arg::Ptr(out), u(channels), u(h), u(w)],
                    )
                }
            }
            Call::Copy => {
                let from = match self.host.decoded[index as usize][i].ins[0] {
                    Operand::Arena(s) => s.offset as usize,
                    _ => return Err(Error::Gpu("a copy reads a value outside the arena".into())),
                };
                let len = len_of(0, self) * 4;
                return self
                    .gpu
                    .copy_within(&mut self.arena, from, out_slot.offset as usize, len)
                    .map_err(gpu_err);
            }
            _ => return Err(Error::Gpu(format!("no CUDA kernel for {call:?}"))),
        };
        r.map_err(gpu_err)
    }
}
