//! Throughput of the `linear` and `conv2d` slots of every kernel table this CPU can run
//! (`edge_kernels_cpu::variants`: generic first), measured in the same run.
//!
//! `cargo run --release -p edge-kernels-cpu --example kbench [threads]` prints, per model-sized
//! shape and table, the best time of repeated calls, GFLOP/s (2·m·k·n for linear,
//! 2·cout·oh·ow·cin·kh·kw for conv2d) and the speed-up over the generic table. A second
//! argument keeps only the benchmarks whose label contains it (`kbench 2 attention`).

use std::time::Instant;

use edge_kernels::{
    conv2d_scratch_bytes, linear_scratch_bytes, quant, Conv2dParams, KernelTable, WeightRef,
};
use edge_schema::DType;

/// 4-byte-aligned byte buffer.
struct Buf(Vec<u32>, usize);

impl Buf {
    fn new(len: usize) -> Self {
        Buf(vec![0; len.div_ceil(4)], len)
    }
    fn bytes(&self) -> &[u8] {
        &zerocopy::IntoBytes::as_bytes(self.0.as_slice())[..self.1]
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        let n = self.1;
        &mut zerocopy::IntoBytes::as_mut_bytes(self.0.as_mut_slice())[..n]
    }
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).max(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32) - 0.5
        })
        .collect()
}

/// `kbench [threads] [filter]`: only the benchmarks whose label contains `filter`.
fn wanted(what: &str) -> bool {
    std::env::args().nth(2).is_none_or(|f| what.contains(&f))
}

/// Best of a few runs, in seconds.
fn time(mut f: impl FnMut()) -> f64 {
    f();
    let mut best = f64::INFINITY;
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < 0.5 {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

fn bench_linear(tables: &[(&str, KernelTable)], dtype: DType, m: usize, k: usize, n: usize) {
    if !wanted(&format!("linear {}", dtype.name()))
        || std::env::var("KBENCH_M").is_ok_and(|v| v != m.to_string())
    {
        return;
    }
    let x = values(m * k, 1);
    let w = values(n * k, 2);
    let row = dtype.bytes_for(k as u64).unwrap_or(0) as usize;
    let mut wb = Buf::new(n * row);
    for j in 0..n {
        quant::quantize_row(
            dtype,
            &w[j * k..(j + 1) * k],
            &mut wb.bytes_mut()[j * row..(j + 1) * row],
        );
    }
    let mut scratch = Buf::new(linear_scratch_bytes(dtype, m, k));
    let mut out = vec![0.0f32; m * n];
    let mut base = 0.0;
    // `KBENCH_EPILOGUE=gelu`: the products with the GELU fused into their epilogue (the table's
    // `gelu_tanh_in_place`, as a plan's `linear+gelu_tanh` step runs them).
    let gelu = std::env::var("KBENCH_EPILOGUE").is_ok_and(|v| v == "gelu");
    for (label, t) in tables {
        let s = time(|| {
            (t.linear.run)(
                &x,
                WeightRef::row_major(dtype, wb.bytes()),
                None,
                &mut out,
                m,
                k,
                n,
                scratch.bytes_mut(),
                gelu.then_some(t.gelu_tanh_in_place.run),
            )
        });
        if base == 0.0 {
            base = s;
        }
        let gflops = 2.0 * (m * k * n) as f64 / s / 1e9;
        println!(
            "linear {:>5} m={m:<5} k={k:<5} n={n:<5} {label:<12} {:9.3} ms {gflops:7.1} GFLOP/s  x{:.1}",
            dtype.name(),
            s * 1e3,
            base / s
        );
    }
}

/// Weights of `dtype` repacked into a plan layout, timed on the tables `keep` accepts: `BF16`
/// in `PackLayout::Bf16Pairs16` (`--target x86_64-avx512bf16` plans) on the tables with the
/// `vdpbf16ps` kernel, `Q8_0` in `PackLayout::Interleaved8x4A7` (`--activation-bits 7` plans)
/// on every SIMD table (elsewhere the generic kernel gathers the layout's blocks one by one:
/// not timed). `what` names the rows and the filter.
fn bench_layout(
    tables: &[(&str, KernelTable)],
    (dtype, layout, what): (DType, edge_schema::plan::PackLayout, &str),
    keep: impl Fn(&str) -> bool,
    (m, k, n): (usize, usize, usize),
) {
    if !wanted(what) {
        return;
    }
    let x = values(m * k, 1);
    let w = values(n * k, 2);
    let row = dtype.bytes_for(k as u64).expect("whole blocks") as usize;
    let mut rm = Buf::new(n * row);
    for (src, dst) in w.chunks(k).zip(rm.bytes_mut().chunks_mut(row)) {
        quant::quantize_row(dtype, src, dst);
    }
    let mut wb = Buf::new(n * row);
    edge_kernels::pack::repack(layout, dtype, rm.bytes(), n, k, wb.bytes_mut());
    let mut scratch = Buf::new(linear_scratch_bytes(dtype, m, k));
    let mut out = vec![0.0f32; m * n];
    for (label, t) in tables.iter().filter(|(l, _)| keep(l)) {
        let s = time(|| {
            (t.linear.run)(
                &x,
                WeightRef {
                    dtype,
                    bytes: wb.bytes(),
                    layout,
                },
                None,
                &mut out,
                m,
                k,
                n,
                scratch.bytes_mut(),
                None,
            )
        });
        let gflops = 2.0 * (m * k * n) as f64 / s / 1e9;
        println!(
            "{what} m={m:<5} k={k:<5} n={n:<5} {label:<12} {:9.3} ms {gflops:7.1} GFLOP/s",
            s * 1e3,
        );
    }
}

fn bench_conv(tables: &[(&str, KernelTable)], cin: usize, cout: usize, hw: usize, k: usize) {
    if !wanted("conv2d") {
        return;
    }
    let pad = k / 2;
    let p = Conv2dParams {
        cin,
        h: hw,
        w: hw,
        cout,
        kh: k,
        kw: k,
        stride_h: 1,
        stride_w: 1,
        pad_top: pad,
        pad_bottom: pad,
        pad_left: pad,
        pad_right: pad,
    };
    let (oh, ow) = p.out_hw();
    let x = values(cin * hw * hw, 3);
    let w = values(cout * cin * k * k, 4);
    let mut wb = Buf::new(w.len() * 4);
    quant::quantize_row(DType::F32, &w, wb.bytes_mut());
    let mut scratch = Buf::new(conv2d_scratch_bytes(&p, DType::F32));
    let mut out = vec![0.0f32; cout * oh * ow];
    let flops = 2.0 * (cout * oh * ow * cin * k * k) as f64;
    let mut base = 0.0;
    for (label, t) in tables {
        let s = time(|| {
            (t.conv2d.run)(
                &p,
                &x,
                WeightRef::row_major(DType::F32, wb.bytes()),
                None,
                &mut out,
                scratch.bytes_mut(),
            )
        });
        if base == 0.0 {
            base = s;
        }
        println!(
            "conv2d f32 {cin:>3}->{cout:<3} {hw}x{hw} k{k} {label:<12} {:9.3} ms {:7.1} GFLOP/s  x{:.1}",
            s * 1e3,
            flops / s / 1e9,
            base / s
        );
    }
}

/// Times `f` on every table; prints ms, a rate (`per` units per call, named `unit`) and the
/// speed-up over the first table.
fn bench_each(
    tables: &[(&str, KernelTable)],
    what: &str,
    per: f64,
    unit: &str,
    mut f: impl FnMut(&KernelTable),
) {
    if !wanted(what) {
        return;
    }
    let mut base = 0.0;
    for (label, t) in tables {
        let s = time(|| f(t));
        if base == 0.0 {
            base = s;
        }
        println!(
            "{what:<44} {label:<12} {:9.3} ms {:7.1} {unit}  x{:.1}",
            s * 1e3,
            per / s / 1e9,
            base / s
        );
    }
}

fn bench_other(tables: &[(&str, KernelTable)]) {
    // PixArt-Σ XL at 512x512: 1024 image tokens, hidden 1152, 16 heads of 72, 300 text tokens.
    let (l, d, heads, hd, lt) = (1024, 1152, 16, 72, 300);
    let qkv = values(l * 3 * d, 5);
    let kv = values(lt * 2 * d, 6);
    let mut out = vec![0f32; l * d];
    let p = edge_kernels::AttentionParams {
        lq: l,
        lk: l,
        heads,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
        q_stride: 3 * d,
        q_offset: 0,
        kv_stride: 3 * d,
        k_offset: d,
        v_offset: 2 * d,
        masked_value: -10000.0,
    };
    let flops = 4.0 * (l * l * heads * hd) as f64;
    bench_each(
        tables,
        "attention self 1024x1024 16x72",
        flops,
        "GFLOP/s",
        |t| (t.attention.run)(&p, &qkv, &qkv, None, None, &mut out),
    );
    // The bf16-products slot only where `vdpbf16ps` serves it (elsewhere the generic scalar
    // step: not timed).
    let bf16: Vec<_> = tables
        .iter()
        .filter(|(_, t)| !t.attention_bf16.name.starts_with("generic"))
        .cloned()
        .collect();
    bench_each(
        &bf16,
        "attention bf16 self 1024x1024 16x72",
        flops,
        "GFLOP/s",
        |t| (t.attention_bf16.run)(&p, &qkv, &qkv, None, None, &mut out),
    );
    let pc = edge_kernels::AttentionParams {
        lk: lt,
        kv_stride: 2 * d,
        k_offset: 0,
        v_offset: d,
        ..p
    };
    let mask = vec![1f32; lt];
    let flops = 4.0 * (l * lt * heads * hd) as f64;
    bench_each(
        tables,
        "attention cross 1024x300 16x72 masked",
        flops,
        "GFLOP/s",
        |t| (t.attention.run)(&pc, &qkv, &kv, Some(&mask), None, &mut out),
    );
    bench_each(
        &bf16,
        "attention bf16 cross 1024x300 16x72 masked",
        flops,
        "GFLOP/s",
        |t| (t.attention_bf16.run)(&pc, &qkv, &kv, Some(&mask), None, &mut out),
    );
    let x = values(l * 4 * d, 7);
    let mut y = vec![0f32; l * 4 * d];
    let n = (l * 4 * d) as f64;
    bench_each(tables, "gelu_tanh 1024x4608", n, "Gelem/s", |t| {
        (t.gelu_tanh.run)(&x, &mut y)
    });
    bench_each(tables, "silu 1024x4608", n, "Gelem/s", |t| {
        (t.silu.run)(&x, &mut y)
    });
    let xs = &x[..l * d];
    let ys = &mut y[..l * d];
    let n = (l * d) as f64;
    bench_each(
        tables,
        "layer_norm 1024x1152 (no affine)",
        n,
        "Gelem/s",
        |t| (t.layer_norm.run)(xs, l, d, 1e-6, None, None, ys),
    );
    let sh = values(d, 8);
    let sc = values(d, 9);
    bench_each(tables, "modulate 1024x1152", n, "Gelem/s", |t| {
        (t.modulate.run)(xs, l, d, &sh, &sc, ys)
    });
    let r = values(l * d, 10);
    bench_each(tables, "gated_residual 1024x1152", n, "Gelem/s", |t| {
        (t.gated_residual.run)(xs, &r, l, d, &sh, ys)
    });
    let (c, hw) = (512, 64 * 64);
    let g = values(c * hw, 11);
    let gw = values(c, 12);
    let gb = values(c, 13);
    let mut go = vec![0f32; c * hw];
    bench_each(
        tables,
        "group_norm 512x64x64, 32 groups",
        (c * hw) as f64,
        "Gelem/s",
        |t| t.group_norm(&g, c, hw, 32, 1e-6, &gw, &gb, &mut go),
    );
}

fn main() {
    if let Some(n) = std::env::args().nth(1).and_then(|a| a.parse().ok()) {
        edge_kernels::init_threads(n);
    }
    println!(
        "threads: {}; cpu: {}",
        rayon::current_num_threads(),
        edge_kernels_cpu::features().summary()
    );
    // `KBENCH_TABLES=avx512,avx512+vnni` keeps only those tables (the speed-up column is then
    // relative to the first one kept), e.g. to profile one table with `perf record`.
    let keep = std::env::var("KBENCH_TABLES").ok();
    let tables: Vec<_> = edge_kernels_cpu::variants()
        .into_iter()
        .filter(|(l, _)| {
            keep.as_deref()
                .is_none_or(|k| k.split(',').any(|x| x == *l))
        })
        .collect();
    bench_other(&tables);
    for (m, k, n) in [
        (16, 192, 768),
        (300, 64, 64),
        (256, 1152, 1152),
        (1024, 1152, 4608),
        (1024, 4608, 1152),
        (1024, 1152, 1152),
        (16, 4096, 10240),
    ] {
        for dtype in [DType::F32, DType::F16, DType::Q8_0, DType::Q4_0] {
            bench_linear(&tables, dtype, m, k, n);
        }
        use edge_schema::plan::PackLayout;
        bench_layout(
            &tables,
            (DType::BF16, PackLayout::Bf16Pairs16, "linear bf16 pairs"),
            |l| l.contains("bf16"),
            (m, k, n),
        );
        bench_layout(
            &tables,
            (DType::Q8_0, PackLayout::Interleaved8x4A7, "linear q8_0 a7"),
            |l| l != "generic",
            (m, k, n),
        );
    }
    for (cin, cout, hw, k) in [
        (32, 32, 64, 3),
        (64, 64, 64, 3),
        (128, 128, 32, 3),
        (64, 3, 64, 3),
        (64, 64, 64, 1),
        (512, 512, 32, 3),
        (256, 256, 64, 3),
        (128, 128, 128, 3),
    ] {
        bench_conv(&tables, cin, cout, hw, k);
    }
}
