//! What the AMX-INT8 tile of `qgemm_amx` costs on this CPU, instruction by instruction, and
//! whether its tile instructions overlap the vector epilogue that scales each block's sums.
//!
//! `cargo run --release -p edge-kernels-x86 --example amxprobe` (Linux on x86-64 with AMX-INT8;
//! elsewhere it says so and exits). Prints, per loop body, the best of 30 runs of 20 000
//! iterations in time-stamp-counter ticks per iteration (`rdtsc`: a fixed-rate clock, not core
//! cycles). The tiles are configured as the quantized tile's (`C` 16 × 64 bytes, `A` 16 × 32,
//! `B` 8 × 64); "epi16" is 16 zmm of that tile's epilogue (`vcvtdq2ps`, two `vmulps`, `vaddps`
//! on sums loaded from memory, accumulators in registers). A body "X + epi16" costing about X's
//! ticks plus epi16's means the two do not overlap. Results: BENCHMARKS.md, fourteenth session.
//! Where AMX-BF16 is present it then compares `tdpbf16ps` with the bf16 arithmetic that the
//! kernels define (and three other models): BENCHMARKS.md, sixteenth session.

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod probe {
    use std::arch::asm;
    use std::arch::x86_64::*;

    /// Tile configuration: palette 1, `tmm0..3` 16 × 64 bytes (`C`), `tmm4`, `tmm5` 16 × 32
    /// (`A`), `tmm6`, `tmm7` 8 × 64 (`B`).
    #[repr(C, align(64))]
    struct Config([u8; 64]);

    /// 64-byte aligned operands.
    #[repr(C, align(64))]
    struct Buf([u8; 32768]);

    fn config() -> Config {
        let mut c = [0u8; 64];
        c[0] = 1;
        let tiles = [(0, 16, 64), (1, 16, 64), (2, 16, 64), (3, 16, 64)]
            .into_iter()
            .chain([(4, 16, 32), (5, 16, 32), (6, 8, 64), (7, 8, 64)]);
        for (t, rows, colsb) in tiles {
            c[16 + 2 * t] = colsb;
            c[48 + t] = rows;
        }
        Config(c)
    }

    /// Best of 30 runs of `n` calls of `body`, in ticks per call.
    fn ticks(n: u32, mut body: impl FnMut()) -> f64 {
        let mut best = u64::MAX;
        for _ in 0..30 {
            // SAFETY: `rdtsc` has no preconditions on x86-64.
            let t = unsafe { _rdtsc() };
            for _ in 0..n {
                body();
            }
            // SAFETY: as above.
            best = best.min(unsafe { _rdtsc() } - t);
        }
        best as f64 / f64::from(n)
    }

    /// A row: `body`'s ticks.
    fn one(rows: &mut Vec<(String, f64)>, n: u32, what: &str, body: impl FnMut()) {
        rows.push((what.into(), ticks(n, body)));
    }

    /// Two rows: `body` alone, then `body` followed by the epilogue `epi`.
    fn with_epilogue(
        rows: &mut Vec<(String, f64)>,
        n: u32,
        what: &str,
        body: impl Fn(),
        epi: &mut impl FnMut(),
    ) {
        one(rows, n, what, &body);
        one(rows, n, &format!("{what} + epi16"), || {
            body();
            epi()
        });
    }

    /// Runs the probes.
    pub fn run() {
        let f = __cpuid_count;
        let amx = f(7, 0).edx >> 25 & 1 == 1 && f(7, 0).ebx >> 16 & 1 == 1;
        // SAFETY: arch_prctl(ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18) only asks
        // Linux for the tile data state; it reads and writes no memory of ours.
        let granted = amx && unsafe { libc::syscall(libc::SYS_arch_prctl, 0x1023, 18) } == 0;
        if !granted {
            println!("amxprobe: this CPU has no AMX-INT8 and AVX-512F, or Linux did not grant the tile state");
            return;
        }
        // SAFETY: AMX-INT8 and AVX-512F are present (checked above: cpuid leaf 7 EDX bit 25,
        // EBX bit 16) and the tile state was granted.
        unsafe { probe() }
        if f(7, 0).edx >> 22 & 1 == 1 {
            // SAFETY: AMX-BF16 is present (cpuid leaf 7 EDX bit 22) and the tile state granted.
            unsafe { bf16_models() }
        } else {
            println!("amxprobe: no AMX-BF16, its arithmetic not probed");
        }
    }

    /// Runs one `asm!` template of tile instructions; every operand register points into a
    /// live 32 KiB buffer with room for the 16 rows it touches.
    macro_rules! tile {
        ($($t:tt)*) => {
            // SAFETY: the tiles are configured (`ldtilecfg` in `probe`) with the shapes each
            // instruction needs, and every address is inside `a`, `b` or `c` (`probe`).
            unsafe { asm!($($t)*) }
        };
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn probe() {
        let cfg = config();
        let (a, b) = (Box::new(Buf([1; 32768])), Box::new(Buf([2; 32768])));
        let mut c = Box::new(Buf([0; 32768]));
        let (ap, bp, cp) = (a.0.as_ptr(), b.0.as_ptr(), c.0.as_mut_ptr());
        tile!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr());
        tile!("tileloadd tmm4, [{a} + {s}*1]", "tileloadd tmm5, [{a} + {s}*1]",
            "tileloadd tmm6, [{b} + {s2}*1]", "tileloadd tmm7, [{b} + {s2}*1]",
            a = in(reg) ap, b = in(reg) bp, s = in(reg) 32usize, s2 = in(reg) 64usize);
        let n = 20_000;
        let mut acc = [_mm512_setzero_ps(); 16];
        let sc = _mm512_set1_ps(1.0001);
        let mut off = 0usize;
        // Sums at `c + 8192 ..`, scales at `c + 16384` (zeros: no subnormal slow path).
        let mut epi16 = || {
            off = (off + 1024) & 4095;
            // SAFETY: 16 rows of 64 bytes from `c + 8192 + off` (≤ 12288 + 1024) and 16 f32 at
            // `c + 16384`, all inside the 32 KiB of `c`; AVX-512F is enabled here.
            unsafe {
                let base = std::hint::black_box(cp.add(8192 + off));
                let dp = cp.add(16384) as *const f32;
                let s = _mm512_mul_ps(sc, _mm512_loadu_ps(std::hint::black_box(dp)));
                for (i, a) in acc.iter_mut().enumerate() {
                    let sums = _mm512_load_si512(base.add(64 * i) as *const __m512i);
                    let d = _mm512_set1_ps(*dp.add(i));
                    let term = _mm512_mul_ps(_mm512_cvtepi32_ps(sums), _mm512_mul_ps(s, d));
                    *a = _mm512_add_ps(*a, term);
                }
            }
        };
        let mut rows: Vec<(String, f64)> = vec![("epi16".into(), ticks(n, &mut epi16))];
        let r = &mut rows;
        one(r, n, "tdpbssd (K = 32), dependent", || {
            tile!("tdpbssd tmm0, tmm4, tmm6")
        });
        let body = || tile!("tdpbssd tmm0, tmm4, tmm6", "tdpbssd tmm1, tmm4, tmm7");
        with_epilogue(r, n, "2 tdpbssd, independent", body, &mut epi16);
        let body = || {
            tile!("tilestored [{c} + {s}*1], tmm2", "tilestored [{c1} + {s}*1], tmm3",
                c = in(reg) cp, c1 = in(reg) cp.wrapping_add(1024), s = in(reg) 64usize)
        };
        with_epilogue(r, n, "2 tilestored", body, &mut epi16);
        let body = || {
            tile!("tileloadd tmm4, [{a} + {s}*1]", "tileloadd tmm6, [{b} + {s2}*1]",
                "tileloadd tmm7, [{b1} + {s2}*1]", a = in(reg) ap, b = in(reg) bp,
                b1 = in(reg) bp.wrapping_add(512), s = in(reg) 32usize, s2 = in(reg) 64usize)
        };
        with_epilogue(r, n, "tileloadd A + 2 B, aligned", body, &mut epi16);
        let body = || tile!("tilezero tmm0", "tilezero tmm1");
        with_epilogue(r, n, "2 tilezero", body, &mut epi16);
        one(
            r,
            n,
            "tileloadd A, rows 32 bytes apart, aligned",
            || tile!("tileloadd tmm4, [{a} + {s}*1]", a = in(reg) ap, s = in(reg) 32usize),
        );
        one(
            r,
            n,
            "tileloadd A, rows across two lines (offset 48)",
            || {
                tile!("tileloadd tmm4, [{a} + {s}*1]", a = in(reg) ap.wrapping_add(48),
                s = in(reg) 32usize)
            },
        );
        one(
            r,
            n,
            "tileloadd B, aligned",
            || tile!("tileloadd tmm6, [{b} + {s}*1]", b = in(reg) bp, s = in(reg) 64usize),
        );
        one(
            r,
            n,
            "tileloadd B, rows across two lines (offset 32)",
            || {
                tile!("tileloadd tmm6, [{b} + {s}*1]", b = in(reg) bp.wrapping_add(32),
                s = in(reg) 64usize)
            },
        );
        tile!("tilerelease");
        let sum: f32 = acc.iter().map(|&v| _mm512_reduce_add_ps(v)).sum();
        std::hint::black_box(sum);
        for (what, t) in rows {
            println!("{what:<48} {t:7.1} ticks");
        }
    }

    /// Whether `tdpbf16ps` follows a model that another CPU can reproduce: random 16 × 16 tiles
    /// (16 bf16 pairs per dot product, accumulators of many magnitudes; bf16 exponents within
    /// 2⁻⁷ .. 2⁷, so that the f64 sums below are exact) against (1) the chain of
    /// [`edge_kernels::bf16dot::pair_step`]s in pair order, the `vdpbf16ps` arithmetic that
    /// `attention_bf16` defines (odd product first), (2) the same with the even product first,
    /// (3) each pair's exact sum added to the accumulator and rounded once per pair, and (4) the
    /// accumulator plus all 32 products, exact, rounded once. Prints the share of outputs each
    /// model gives bit for bit.
    #[target_feature(enable = "avx512f")]
    unsafe fn bf16_models() {
        use edge_kernels::bf16dot::pair_step;
        #[repr(C, align(64))]
        struct Tile<T>([[T; 16]; 16]);
        let mut cfg = Config([0; 64]);
        cfg.0[0] = 1;
        for t in 0..3 {
            cfg.0[16 + 2 * t] = 64;
            cfg.0[48 + t] = 16;
        }
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let bf = |r: u64| {
            let exp = 120 + (r % 15) as u16;
            u32::from(((r >> 8) as u16 & 0x8000) | (exp << 7) | ((r >> 20) as u16 & 0x7f))
        };
        let half = |h: u32| f64::from(f32::from_bits(h << 16));
        let (mut hits, mut total) = ([0usize; 4], 0usize);
        for _ in 0..500 {
            let mut a = Tile([[0u32; 16]; 16]);
            let mut b = Tile([[0u32; 16]; 16]);
            let mut c = Tile([[0f32; 16]; 16]);
            for i in 0..16 {
                for j in 0..16 {
                    a.0[i][j] = bf(next()) | bf(next()) << 16;
                    b.0[i][j] = bf(next()) | bf(next()) << 16;
                    let e = (next() % 40) as i32 - 20;
                    c.0[i][j] = ((next() % 4001) as f32 - 2000.0) * 2f32.powi(e);
                }
            }
            let c0 = c.0;
            let (ap, bp, cp) = (a.0.as_ptr(), b.0.as_ptr(), c.0.as_mut_ptr());
            tile!("ldtilecfg [{cfg}]", "tileloadd tmm0, [{c} + {s}*1]",
                "tileloadd tmm1, [{a} + {s}*1]", "tileloadd tmm2, [{b} + {s}*1]",
                "tdpbf16ps tmm0, tmm1, tmm2", "tilestored [{c} + {s}*1], tmm0", "tilerelease",
                cfg = in(reg) cfg.0.as_ptr(), c = in(reg) cp, a = in(reg) ap, b = in(reg) bp,
                s = in(reg) 64usize);
            for m in 0..16 {
                for n in 0..16 {
                    let (mut odd, mut even, mut per_pair) = (c0[m][n], c0[m][n], c0[m][n]);
                    let mut all = f64::from(c0[m][n]);
                    for k in 0..16 {
                        let (x, w) = (a.0[m][k], b.0[k][n]);
                        odd = pair_step(odd, x, w);
                        even = pair_step(even, x.rotate_left(16), w.rotate_left(16));
                        let pair =
                            half(x & 0xffff) * half(w & 0xffff) + half(x >> 16) * half(w >> 16);
                        per_pair = (f64::from(per_pair) + pair) as f32;
                        all += pair;
                    }
                    let got = c.0[m][n].to_bits();
                    for (h, v) in hits.iter_mut().zip([odd, even, per_pair, all as f32]) {
                        *h += usize::from(v.to_bits() == got);
                    }
                    total += 1;
                }
            }
        }
        println!("tdpbf16ps, {total} outputs of 16-pair dot products, share given bit for bit by:");
        let models = [
            "pair_step chain, odd product first (attention_bf16)",
            "pair_step chain, even product first",
            "each pair's exact sum, rounded per pair",
            "all 32 products and the accumulator exact, rounded once",
        ];
        for (what, h) in models.iter().zip(hits) {
            println!("  {what:<58} {:5.1} %", 100.0 * h as f64 / total as f64);
        }
    }
}

fn main() {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    probe::run();
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    println!("amxprobe: x86-64 Linux only");
}
