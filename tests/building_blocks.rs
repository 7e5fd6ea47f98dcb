//! The kernels' building blocks on every ISA level under test (the vector types, the GEMM
//! micro-kernel, the block transpose, block zeroing) and the levels themselves. Integration
//! tests rather than unit tests, so the emulator lanes build only the library (a `--lib` test
//! build compiles it a second time).

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod vector_types {
    use half::{bf16, f16};
    use ssmk::dtype::Element;
    use ssmk::kernels::simd::*;
    use ssmk::runtime::Isa;

    /// Runs `body` under AVX2 codegen, as kernels do.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn with_avx2<R>(body: impl FnOnce() -> R) -> R {
        body()
    }

    /// Runs `body` under NEON codegen, as kernels do.
    #[cfg(target_arch = "aarch64")]
    #[target_feature(enable = "neon")]
    unsafe fn with_neon<R>(body: impl FnOnce() -> R) -> R {
        body()
    }

    /// The codegen the transpose is written for on this architecture.
    #[cfg(target_arch = "x86_64")]
    use with_avx2 as with_transpose_isa;
    #[cfg(target_arch = "aarch64")]
    use with_neon as with_transpose_isa;

    /// Every block and edge shape against the element-by-element transpose (one code for every
    /// ISA of an architecture).
    #[test]
    fn transpose_matches_naive() {
        if Isa::under_test().into_iter().any(|isa| isa > Isa::Scalar) {
            for (rows, cols) in [(8, 8), (64, 128), (13, 21), (32, 7), (5, 16), (1, 1)] {
                let (lds, ldd) = (cols + 3, rows + 5);
                let src: Vec<f32> = (0..rows * lds).map(|i| i as f32).collect();
                let mut dst = vec![-1f32; cols * ldd];
                unsafe {
                    with_transpose_isa(|| {
                        transpose(src.as_ptr(), lds, dst.as_mut_ptr(), ldd, rows, cols)
                    })
                };
                for (i, &d) in dst.iter().enumerate() {
                    let (c, r) = (i / ldd, i % ldd);
                    let want = if r < rows { src[r * lds + c] } else { -1.0 };
                    assert_eq!(d, want, "{rows}x{cols}: dst[{c}][{r}]");
                }
            }
        }
    }

    fn check_roundtrips<S: Simd>() {
        let n = S::LANES;
        let mut rng = 0x1234_5678u32;
        for round in 0..20_000 {
            let xs: Vec<f32> = (0..n)
                .map(|i| {
                    rng = rng.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    match (round + i) % 7 {
                        0 => f32::from_bits(rng),
                        1 => (rng as f32 / u32::MAX as f32 - 0.5) * 200.0,
                        _ => f32::from_bits(rng & 0x8fff_ffff),
                    }
                })
                .collect();
            unsafe {
                let v = S::load_f32(xs.as_ptr());
                let mut b = vec![0u16; n];
                S::store_bf16(b.as_mut_ptr(), v);
                let mut h = vec![0u16; n];
                S::store_f16(h.as_mut_ptr(), v);
                for i in 0..n {
                    let want_b = <bf16 as Element>::from_f32(xs[i]).to_bits();
                    let want_h = f16::from_f32(xs[i]).to_bits();
                    if xs[i].is_nan() {
                        assert!(bf16::from_bits(b[i]).is_nan() && f16::from_bits(h[i]).is_nan());
                    } else {
                        assert_eq!(b[i], want_b, "bf16 of {:e}", xs[i]);
                        assert_eq!(h[i], want_h, "f16 of {:e}", xs[i]);
                    }
                }
                let mut back = vec![0f32; n];
                S::store_f32(back.as_mut_ptr(), S::round_bf16(v));
                for i in 0..n {
                    let want = bf16::from_bits(b[i]).to_f32();
                    assert!(
                        back[i].to_bits() == want.to_bits() || want.is_nan() && back[i].is_nan()
                    );
                }
                S::store_f32(back.as_mut_ptr(), S::round_f16(v));
                for i in 0..n {
                    let want = f16::from_bits(h[i]).to_f32();
                    assert!(
                        back[i].to_bits() == want.to_bits() || want.is_nan() && back[i].is_nan()
                    );
                }
                S::store_f32(back.as_mut_ptr(), S::load_bf16(b.as_ptr()));
                for i in 0..n {
                    assert_eq!(back[i].to_bits(), bf16::from_bits(b[i]).to_f32().to_bits());
                }
                S::store_f32(back.as_mut_ptr(), S::load_f16(h.as_ptr()));
                for i in 0..n {
                    assert_eq!(back[i].to_bits(), f16::from_bits(h[i]).to_f32().to_bits());
                }
            }
        }
    }

    /// The NaN-check-free bf16 rounding equals the full one on products of bf16 values, NaNs,
    /// infinities and overflows included, bit for bit.
    fn check_bf16_products<S: Simd>() {
        let n = S::LANES;
        let mut rng = 0x9e37_79b9u32;
        let mut bits = || {
            rng = rng.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            match rng >> 29 {
                0 => 0x7f80 | (rng as u16 & 0x807f), // NaN or infinity, any payload
                1 => 0x5f80 | (rng as u16 & 0x807f), // about 2^64: squares overflow
                _ => (rng >> 8) as u16,
            }
        };
        for _ in 0..20_000 {
            let (a, b): (Vec<u16>, Vec<u16>) = (0..n).map(|_| (bits(), bits())).unzip();
            unsafe {
                let product = S::mul(S::load_bf16(a.as_ptr()), S::load_bf16(b.as_ptr()));
                let (mut want, mut got) = (vec![0f32; n], vec![0f32; n]);
                S::store_f32(want.as_mut_ptr(), S::round_bf16(product));
                S::store_f32(got.as_mut_ptr(), S::round_bf16_bf16_nans(product));
                let same =
                    |x: &[f32], y: &[f32]| x.iter().zip(y).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(
                    same(&want, &got),
                    "rounded {a:x?} * {b:x?}: {want:?} vs {got:?}"
                );
                let (mut want, mut got) = (vec![0u16; n], vec![0u16; n]);
                S::store_bf16(want.as_mut_ptr(), product);
                S::store_bf16_bf16_nans(got.as_mut_ptr(), product);
                assert_eq!(want, got, "stored {a:x?} * {b:x?}");
            }
        }
    }

    fn check_exp<S: Simd>() {
        let n = S::LANES;
        let mut x = -100.0f32;
        let mut worst = 0.0f64;
        while x < 100.0 {
            let xs: Vec<f32> = (0..n).map(|i| x + i as f32 * 1e-3).collect();
            let mut out = vec![0f32; n];
            unsafe { S::store_f32(out.as_mut_ptr(), S::exp(S::load_f32(xs.as_ptr()))) };
            for i in 0..n {
                let want = (xs[i] as f64).exp();
                if xs[i] < -87.336_55 {
                    assert!(out[i] <= 1.21e-38, "exp({}) = {}", xs[i], out[i]);
                } else if xs[i] > 88.376_26 {
                    assert!(
                        out[i] > 2e38 && out[i].is_finite(),
                        "exp({}) = {}",
                        xs[i],
                        out[i]
                    );
                } else {
                    worst = worst.max(((out[i] as f64 - want) / want).abs());
                }
            }
            x += 0.0173;
        }
        assert!(worst < 4e-7, "exp worst relative error {worst:e}");
    }

    /// Conversions, `exp`, the NaN-check-free bf16 rounding of products and the horizontal sum of
    /// one vector type.
    /// `clamp` against `max` then `min`, bit for bit, NaN, infinities and signed zeros included.
    fn check_clamp<S: Simd>() {
        let specials = [
            f32::NAN,
            -f32::NAN,
            f32::NEG_INFINITY,
            f32::INFINITY,
            -0.0,
            0.0,
        ];
        let values: Vec<f32> = specials
            .into_iter()
            .chain((0..64).map(|i| (i as f32 - 32.0) * 5.5))
            .collect();
        for x in values.chunks(S::LANES) {
            let mut lanes = x.to_vec();
            lanes.resize(S::LANES, 1.0);
            let (mut want, mut got) = (vec![0f32; S::LANES], vec![0f32; S::LANES]);
            unsafe {
                let v = S::load_f32(lanes.as_ptr());
                let (lo, hi) = (-88.75, 87.0);
                S::store_f32(
                    want.as_mut_ptr(),
                    S::min(S::max(v, S::splat(lo)), S::splat(hi)),
                );
                S::store_f32(got.as_mut_ptr(), S::clamp(v, lo, hi));
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&want), bits(&got), "clamp of {lanes:?}");
        }
    }

    fn check_vector_type<S: Simd>() {
        check_roundtrips::<S>();
        check_exp::<S>();
        check_bf16_products::<S>();
        check_clamp::<S>();
        let v: Vec<f32> = (1..=S::LANES).map(|i| i as f32).collect();
        let want = (S::LANES * (S::LANES + 1) / 2) as f32;
        assert_eq!(unsafe { S::reduce_sum(S::load_f32(v.as_ptr())) }, want);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    unsafe fn with_avx512<R>(body: impl FnOnce() -> R) -> R {
        body()
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")]
    unsafe fn with_avx512_bf16<R>(body: impl FnOnce() -> R) -> R {
        body()
    }

    /// `dot_bf16_pairs` lane by lane against exact f64 sums of pairs of bf16 (the products of
    /// two bf16 are exact; the two sums round once each, so within 2 ulps of the f32 sum),
    /// including the denormal inputs it reads as zero.
    #[cfg(target_arch = "x86_64")]
    fn check_bf16_dot<S: Simd>() {
        let lanes = S::LANES;
        let bits = |i: usize, salt: usize| {
            let x = bf16::from_f32(((i * 7919 + salt * 104_729) % 199) as f32 / 17.0 - 5.8);
            x.to_bits()
        };
        let pair = |i: usize, salt: usize| {
            u32::from(bits(2 * i, salt)) | u32::from(bits(2 * i + 1, salt)) << 16
        };
        let a: Vec<u32> = (0..lanes).map(|i| pair(i, 1)).collect();
        let mut b: Vec<u32> = (0..lanes).map(|i| pair(i, 2)).collect();
        b[0] = 0x0001_3f80; // odd half 1.0, even half the smallest bf16 denormal: read as zero
        let acc: Vec<f32> = (0..lanes).map(|i| i as f32 * 0.25 - 1.0).collect();
        let mut got = vec![0f32; lanes];
        unsafe {
            let v = S::dot_bf16_pairs(
                S::load_f32(acc.as_ptr()),
                S::load_f32(a.as_ptr().cast()),
                S::load_f32(b.as_ptr().cast()),
            );
            S::store_f32(got.as_mut_ptr(), v);
        }
        let half = |p: u32, odd: bool| {
            let x = f32::from_bits(if odd { p >> 16 } else { p & 0xffff } << 16);
            if x.is_subnormal() { 0.0 } else { f64::from(x) }
        };
        for l in 0..lanes {
            let want = f64::from(acc[l])
                + half(a[l], true) * half(b[l], true)
                + half(a[l], false) * half(b[l], false);
            let tol = 2.0 * f64::from(f32::EPSILON) * (want.abs() + 8.0);
            assert!(
                (f64::from(got[l]) - want).abs() <= tol,
                "lane {l}: {} vs {want}",
                got[l]
            );
        }
    }

    /// `e^x` of one vector type over `[-90, 90]` and the clamp edges, as bits.
    #[cfg(target_arch = "x86_64")]
    fn exp_bits<S: Simd>() -> Vec<u32> {
        let mut xs: Vec<f32> = (0..180_000).map(|i| -90.0 + i as f32 * 1e-3).collect();
        xs.extend([
            -87.336_55,
            -87.336_54,
            88.376_26,
            88.376_25,
            -0.0,
            f32::MIN_POSITIVE,
        ]);
        xs.resize(xs.len().next_multiple_of(16), 0.0);
        let mut out = vec![0f32; xs.len()];
        for (x, o) in xs
            .chunks_exact(S::LANES)
            .zip(out.chunks_exact_mut(S::LANES))
        {
            unsafe { S::store_f32(o.as_mut_ptr(), S::exp(S::load_f32(x.as_ptr()))) };
        }
        out.iter().map(|v| v.to_bits()).collect()
    }

    /// AVX-512 scales `e^r` by `2^n` in one instruction, AVX2 in two exact halves: the same bits.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn exp_is_the_same_on_every_isa() {
        let isas = Isa::under_test();
        if isas.contains(&Isa::Avx2) && isas.contains(&Isa::Avx512) {
            let avx2 = unsafe { with_avx2(exp_bits::<Avx2>) };
            assert!(avx2 == unsafe { with_avx512(exp_bits::<Avx512>) });
            assert!(avx2 == unsafe { with_avx2(exp_bits::<Avx2Pairs>) });
        }
    }

    /// Every vector type of each SIMD level under test.
    #[test]
    fn every_isa_vector_types() {
        for isa in Isa::under_test() {
            match isa {
                Isa::Scalar => {}
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => unsafe {
                    with_avx2(check_vector_type::<Avx2>);
                    with_avx2(check_vector_type::<Avx2Pairs>);
                },
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => unsafe { with_avx512(check_vector_type::<Avx512>) },
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512Bf16 => unsafe {
                    with_avx512_bf16(check_vector_type::<Avx512Bf16>);
                    with_avx512_bf16(check_bf16_dot::<Avx512Bf16>);
                },
                #[cfg(target_arch = "aarch64")]
                Isa::Neon => unsafe { with_neon(check_vector_type::<Neon>) },
                #[allow(unreachable_patterns)]
                other => panic!("no vector type of {other:?} on this architecture"),
            }
        }
    }
}

mod gemm {
    use ssmk::kernels::gemm::{MatA, Start, gemm};
    #[cfg(target_arch = "aarch64")]
    use ssmk::kernels::simd::Neon;
    #[cfg(target_arch = "x86_64")]
    use ssmk::kernels::simd::{Avx2, Avx512, Avx512Bf16};
    use ssmk::runtime::Isa;

    type GemmFn =
        unsafe fn(usize, usize, usize, MatA, *const f32, usize, *mut f32, usize, Start, bool);

    macro_rules! gemm_for {
        ($name:ident, $simd:ty, $features:literal) => {
            #[target_feature(enable = $features)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn $name(
                m: usize,
                n: usize,
                p: usize,
                a: MatA,
                b: *const f32,
                ldb: usize,
                c: *mut f32,
                ldc: usize,
                start: Start,
                lower: bool,
            ) {
                unsafe { gemm::<$simd>(m, n, p, a, b, ldb, c, ldc, start, lower) }
            }
        };
    }
    #[cfg(target_arch = "x86_64")]
    gemm_for!(gemm_avx2, Avx2, "avx2,fma,f16c");
    #[cfg(target_arch = "x86_64")]
    gemm_for!(
        gemm_avx512,
        Avx512,
        "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"
    );
    #[cfg(target_arch = "aarch64")]
    gemm_for!(gemm_neon, Neon, "neon");
    #[cfg(target_arch = "x86_64")]
    gemm_for!(
        gemm_avx512_bf16,
        Avx512Bf16,
        "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c"
    );

    /// `C = start + A B^T` of bf16 rows `a [m][p]`, `b [n][p]` (element strides `(row, col)`)
    /// through the packing and [`ssmk::kernels::gemm::gemm_bf16_pairs`] of AVX512_BF16.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm_bf16_rows(
        (m, n, p): (usize, usize, usize),
        a: (*const u16, (usize, usize)),
        b: (*const u16, (usize, usize)),
        c: *mut f32,
        ldc: usize,
        start: Start,
    ) {
        use ssmk::kernels::gemm::{gemm_bf16_pairs, pack_bf16_pairs, pack_bf16_pairs_transposed};
        let pairs = p.div_ceil(2);
        let ldb = n.next_multiple_of(16);
        let mut a_pairs = vec![0u32; m * pairs];
        // The columns past n are computed too: B holds numbers there.
        let mut bt_pairs = vec![0u32; pairs * ldb];
        unsafe {
            pack_bf16_pairs(a.0, a.1, m, p, a_pairs.as_mut_ptr(), pairs);
            pack_bf16_pairs_transposed(b.0, b.1, n, p, bt_pairs.as_mut_ptr(), ldb);
            gemm_bf16_pairs::<Avx512Bf16>(
                m,
                n,
                pairs,
                (a_pairs.as_ptr(), pairs),
                (bt_pairs.as_ptr(), ldb),
                c,
                ldc,
                start,
            );
        }
    }

    /// The bf16 pair GEMM and its packing (odd and even sums, strided and transposed rows,
    /// column remainders computed as whole vectors) against f64 sums of the same bf16 values.
    #[cfg(target_arch = "x86_64")]
    fn check_bf16_pairs_against_naive() {
        use half::bf16;
        for &(m, n, p) in &[
            (16, 16, 128),
            (64, 64, 128),
            (13, 37, 9),
            (6, 1, 1),
            (9, 83, 17),
            (1, 130, 64),
        ] {
            for (strided, start) in [(false, Start::Zero), (true, Start::C)] {
                let val = |i: usize, salt: usize| {
                    bf16::from_f32(((i * 7919 + salt) % 97) as f32 / 97.0 - 0.5).to_bits()
                };
                // Strided: element (i, l) at i + l * rows (column-major), as a transposed view.
                let (a, a_strides) = match strided {
                    false => ((0..m * p).map(|i| val(i, 3)).collect::<Vec<_>>(), (p, 1)),
                    true => ((0..m * p).map(|i| val(i, 3)).collect(), (1, m)),
                };
                let (b, b_strides) = ((0..n * p).map(|i| val(i, 11)).collect::<Vec<_>>(), (p, 1));
                let ldc = n.next_multiple_of(16);
                let c0: Vec<f32> = (0..m * ldc).map(|i| (i % 5) as f32).collect();
                let mut c = c0.clone();
                unsafe {
                    gemm_bf16_rows(
                        (m, n, p),
                        (a.as_ptr(), a_strides),
                        (b.as_ptr(), b_strides),
                        c.as_mut_ptr(),
                        ldc,
                        start,
                    )
                };
                let f = |x: u16| f64::from(bf16::from_bits(x).to_f32());
                for i in 0..m {
                    for j in 0..n {
                        let dot: f64 = (0..p)
                            .map(|l| {
                                f(a[i * a_strides.0 + l * a_strides.1]) * f(b[j * b_strides.0 + l])
                            })
                            .sum();
                        let want = dot
                            + if let Start::C = start {
                                f64::from(c0[i * ldc + j])
                            } else {
                                0.0
                            };
                        let got = f64::from(c[i * ldc + j]);
                        assert!(
                            (got - want).abs() < 1e-5 * (p as f64 + 4.0),
                            "{m}x{n}x{p} strided {strided}: [{i}][{j}] {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// Every shape class (full tiles, row/column remainders, transposed A, lower A, each start of
    /// C) against a plain triple loop.
    #[test]
    fn every_isa_gemm_matches_naive() {
        for isa in Isa::under_test() {
            match isa {
                Isa::Scalar => {}
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => check_against_naive(gemm_avx2),
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => check_against_naive(gemm_avx512),
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512Bf16 => {
                    check_against_naive(gemm_avx512_bf16);
                    check_bf16_pairs_against_naive();
                }
                #[cfg(target_arch = "aarch64")]
                Isa::Neon => check_against_naive(gemm_neon),
                #[allow(unreachable_patterns)]
                other => panic!("no GEMM of {other:?} on this architecture"),
            }
        }
    }

    fn check_against_naive(kernel: GemmFn) {
        for &(m, n, p) in &[
            (64, 128, 128),
            (13, 37, 9),
            (1, 8, 1),
            (7, 16, 64),
            (64, 64, 64),
            (5, 3, 2),
            // AVX-512: a 4-vector panel, then a single vector, then scalar columns; AVX2:
            // 2-vector panels, then scalar columns.
            (9, 83, 17),
            // AVX-512: 4-, 2- and 1-vector panels, then scalar columns.
            (11, 115, 13),
        ] {
            let decay: Vec<f32> = (0..m).map(|i| 0.5 + (i % 7) as f32 / 8.0).collect();
            for (transposed, lower, start) in [
                (false, false, Start::Zero),
                (true, false, Start::C),
                (false, true, Start::C),
                (false, false, Start::DecayedC(decay.as_ptr())),
                (true, false, Start::DecayedC(decay.as_ptr())),
            ] {
                let a: Vec<f32> = (0..m * p.max(m))
                    .map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5)
                    .collect();
                let b: Vec<f32> = (0..p * n)
                    .map(|i| ((i * 104729) % 89) as f32 / 89.0 - 0.5)
                    .collect();
                let c0: Vec<f32> = (0..m * n).map(|i| (i % 5) as f32).collect();
                let mat = if transposed {
                    MatA {
                        ptr: a.as_ptr(),
                        row_stride: 1,
                        col_stride: m,
                    }
                } else {
                    MatA {
                        ptr: a.as_ptr(),
                        row_stride: p,
                        col_stride: 1,
                    }
                };
                let at = |i: usize, l: usize| {
                    if lower && l > i {
                        0.0
                    } else {
                        a[i * mat.row_stride + l * mat.col_stride]
                    }
                };
                let mut a_masked = a.clone();
                if lower {
                    for i in 0..m {
                        for l in i + 1..p {
                            a_masked[i * p + l] = 0.0;
                        }
                    }
                }
                let mat = MatA {
                    ptr: a_masked.as_ptr(),
                    ..mat
                };
                let mut c = c0.clone();
                unsafe { kernel(m, n, p, mat, b.as_ptr(), n, c.as_mut_ptr(), n, start, lower) };
                for i in 0..m {
                    for j in 0..n {
                        let c_start = match start {
                            Start::Zero => 0.0,
                            Start::C => c0[i * n + j],
                            Start::DecayedC(_) => c0[i * n + j] * decay[i],
                        };
                        let want: f32 =
                            (0..p).map(|l| at(i, l) * b[l * n + j]).sum::<f32>() + c_start;
                        assert!(
                            (c[i * n + j] - want).abs() < 1e-4,
                            "{m}x{n}x{p} t{transposed} l{lower}: [{i}][{j}]"
                        );
                    }
                }
            }
        }
    }

    /// Throughput of the 64 x 128 x 128 shape (`cargo test --release gemm_speed -- --ignored`).
    #[cfg(target_arch = "x86_64")]
    #[test]
    #[ignore]
    fn gemm_speed() {
        let (m, n, p) = (64, 128, 128);
        let a = vec![0.5f32; m * p];
        let b = vec![0.25f32; p * n];
        let mut c = vec![0f32; m * n];
        let reps = 20_000;
        let t0 = std::time::Instant::now();
        for _ in 0..reps {
            unsafe {
                gemm_avx2(
                    m,
                    n,
                    p,
                    MatA {
                        ptr: a.as_ptr(),
                        row_stride: p,
                        col_stride: 1,
                    },
                    b.as_ptr(),
                    n,
                    c.as_mut_ptr(),
                    n,
                    Start::C,
                    false,
                )
            };
        }
        let s = t0.elapsed().as_secs_f64();
        println!(
            "gemm 64x128x128: {:.1} GFLOP/s",
            (2 * m * n * p * reps) as f64 / s / 1e9
        );
        std::hint::black_box(&c);
    }
}

mod zeroing {
    use ssmk::kernels::memory::zero_fn;
    use ssmk::runtime::Isa;

    #[test]
    fn every_isa_zero_variant_matches_reference() {
        for isa in Isa::under_test() {
            let f = zero_fn(isa);
            for len in [0usize, 1, 31, 63, 64, 65, 4095, 4096, 4097, 70_000, 300_001] {
                for misalign in [0usize, 1, 17, 33] {
                    let mut buf = vec![0xA5u8; len + misalign + 64];
                    unsafe { f(buf.as_mut_ptr().add(misalign), len) };
                    assert!(
                        buf[..misalign].iter().all(|&b| b == 0xA5),
                        "{isa:?} head {len} {misalign}"
                    );
                    assert!(
                        buf[misalign..misalign + len].iter().all(|&b| b == 0),
                        "{isa:?} body {len}"
                    );
                    assert!(
                        buf[misalign + len..].iter().all(|&b| b == 0xA5),
                        "{isa:?} tail {len} {misalign}"
                    );
                }
            }
        }
    }
}

mod runtime {
    use ssmk::runtime::Isa;

    #[test]
    fn isa_levels() {
        assert!(Isa::active() <= Isa::detected());
        assert_eq!(Isa::parse("AVX2"), Some(Isa::Avx2));
        assert_eq!(Isa::parse("sse"), None);
        assert_eq!(Isa::supported()[0], Isa::Scalar);
        assert!(Isa::supported().iter().all(|&i| i.for_this_cpu() == i));
        assert_eq!(Isa::parse("neon"), Some(Isa::Neon));
        #[cfg(target_arch = "x86_64")]
        assert_eq!(Isa::Neon.for_this_cpu(), Isa::Scalar);
        #[cfg(target_arch = "aarch64")]
        assert_eq!(Isa::Avx512.for_this_cpu(), Isa::Scalar);
    }
}
