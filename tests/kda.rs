//! Kimi Delta Attention: `ssmk_kda_gating` (ABI.md §4.8) against f64 math written here, and every
//! rejected input with nothing written.
//!
//! Tolerances: g within 1e-5 relative + 1e-6 absolute (f32 arithmetic with libm-accurate
//! `exp`/`log1p`); beta within its dtype's rounding (f32 1e-6, f16 2^-11, bf16 2^-8 relative).
mod common;

use common::{Ctx, Rng, Tensor, assert_error};
use ssmk::dtype::DType;
use ssmk::ffi::gdn::ssmk_kda_gating;
use ssmk::ffi::status::*;
use ssmk::runtime::{Isa, with_isa};
use ssmk::tensor::ssmk_tensor;

/// `ssmk_kda_gating` with these descriptors (`None` = NULL).
#[allow(clippy::too_many_arguments)]
fn export(
    ctx: &Ctx,
    a_log: Option<&ssmk_tensor>,
    a: &ssmk_tensor,
    dt_bias: Option<&ssmk_tensor>,
    lower_bound: f32,
    b: Option<&ssmk_tensor>,
    g: &mut ssmk_tensor,
    beta: Option<&mut ssmk_tensor>,
) -> i32 {
    let p = |d: Option<&ssmk_tensor>| d.map_or(std::ptr::null(), |d| d as *const _);
    unsafe {
        ssmk_kda_gating(
            ctx.0,
            p(a_log),
            a,
            p(dt_bias),
            lower_bound,
            p(b),
            g,
            beta.map_or(std::ptr::null_mut(), |d| d as *mut _),
        )
    }
}

/// One gating call's tensors.
struct Gates {
    a_log: Tensor,
    a: Tensor,
    dt_bias: Option<Tensor>,
    lower_bound: f32,
    b: Option<Tensor>,
    g: Tensor,
    beta: Option<Tensor>,
}

impl Gates {
    fn new(n: usize, hv: usize, k: usize, dtype: DType, seed: u64) -> Gates {
        let mut rng = Rng::new(seed);
        let mut fill = |t: &mut Tensor, f: &dyn Fn(f64) -> f64| {
            for idx in t.indices() {
                let u = rng.uniform();
                t.set(&idx, f(u));
            }
        };
        let mut a_log = Tensor::zeros(DType::F32, &[hv]);
        fill(&mut a_log, &|u| 3.0 * u - 1.5);
        let mut a = Tensor::zeros(dtype, &[n, hv, k]);
        fill(&mut a, &|u| 50.0 * u - 25.0); // crosses the softplus threshold both ways
        let mut dt_bias = Tensor::zeros(DType::F32, &[hv, k]);
        fill(&mut dt_bias, &|u| 2.0 * u - 1.0);
        let mut b = Tensor::zeros(dtype, &[n, hv]);
        fill(&mut b, &|u| 16.0 * u - 8.0);
        let mut g = Tensor::zeros(DType::F32, &[n, hv, k]);
        fill(&mut g, &|u| u + 7.0); // sentinels: a rejected call must leave them
        let mut beta = Tensor::zeros(dtype, &[n, hv]);
        fill(&mut beta, &|u| u + 7.0);
        Gates {
            a_log,
            a,
            dt_bias: Some(dt_bias),
            lower_bound: 0.0,
            b: Some(b),
            g,
            beta: Some(beta),
        }
    }

    fn call(&mut self, ctx: &Ctx) -> i32 {
        let d = |t: &Option<Tensor>| t.as_ref().map(Tensor::desc);
        let (al, a, mut g) = (self.a_log.desc(), self.a.desc(), self.g.desc());
        let (bias, b, mut beta) = (d(&self.dt_bias), d(&self.b), d(&self.beta));
        export(
            ctx,
            Some(&al),
            &a,
            bias.as_ref(),
            self.lower_bound,
            b.as_ref(),
            &mut g,
            beta.as_mut(),
        )
    }

    /// Checks g and beta against f64 math.
    fn verify(&self, what: &str) {
        let (n, hv, k) = (
            self.a.shape[0] as usize,
            self.a.shape[1] as usize,
            self.a.shape[2] as usize,
        );
        let lower = self.lower_bound as f64;
        for i in 0..n {
            for h in 0..hv {
                let e = self.a_log.get(&[h]).exp();
                for c in 0..k {
                    let bias = self.dt_bias.as_ref().map_or(0.0, |d| match d.shape.len() {
                        1 => d.get(&[h * k + c]),
                        _ => d.get(&[h, c]),
                    });
                    let x = self.a.get(&[i, h, c]) + bias;
                    let want = if lower == 0.0 {
                        -e * if x > 20.0 { x } else { x.exp().ln_1p() }
                    } else {
                        lower / (1.0 + (-e * x).exp())
                    };
                    let got = self.g.get(&[i, h, c]);
                    assert!(
                        (got - want).abs() <= 1e-6 + 1e-5 * want.abs(),
                        "{what}: g[{i}][{h}][{c}] = {got} vs {want}"
                    );
                }
                if let (Some(b), Some(beta)) = (&self.b, &self.beta) {
                    let want = 1.0 / (1.0 + (-b.get(&[i, h])).exp());
                    let got = beta.get(&[i, h]);
                    let rel = match beta.dtype {
                        DType::BF16 => 1.0 / 256.0,
                        DType::F16 => 1.0 / 2048.0,
                        _ => 1e-6,
                    };
                    assert!(
                        (got - want).abs() <= 1e-7 + rel * want,
                        "{what}: beta[{i}][{h}] = {got} vs {want}"
                    );
                }
            }
        }
    }
}

/// Both gate forms, each activation dtype, `dt_bias` `[HV, K]`, `[HV*K]` and NULL, with and
/// without the fused beta, on one and several row tasks, for the scalar reference and each SIMD
/// ISA (odd K leaves a vector tail).
#[test]
fn every_isa_kda_gating_matches_reference() {
    let mut seed = 0;
    for isa in Isa::under_test() {
        for (n, hv, k) in [(1, 1, 1), (3, 4, 16), (70, 3, 33), (130, 2, 8)] {
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                for lower_bound in [0.0f32, -5.0] {
                    seed += 1;
                    let mut gates = Gates::new(n, hv, k, dtype, seed);
                    gates.lower_bound = lower_bound;
                    match seed % 3 {
                        0 => gates.dt_bias = None,
                        1 => {
                            let d = gates.dt_bias.as_mut().unwrap();
                            d.shape = vec![(hv * k) as i64];
                        }
                        _ => {}
                    }
                    if seed % 4 == 0 {
                        (gates.b, gates.beta) = (None, None);
                    }
                    let what = format!("{isa:?} {n}x{hv}x{k} {dtype:?} lower {lower_bound}");
                    let code = with_isa(isa, || gates.call(&Ctx::new(2)));
                    assert_eq!(code, SSMK_OK, "{what}: {}", common::last_error());
                    gates.verify(&what);
                }
            }
        }
    }
}

/// Every bad input is rejected with its status and message, and nothing is written.
#[test]
fn kda_gating_rejects_bad_inputs() {
    type Mutate = Box<dyn Fn(&mut Gates)>;
    let cases: Vec<(&str, Mutate, i32, &[&str])> = vec![
        (
            "positive bound",
            Box::new(|g| g.lower_bound = 0.5),
            SSMK_ERR_INVALID_ARGUMENT,
            &["lower_bound = 0.5"],
        ),
        (
            "NaN bound",
            Box::new(|g| g.lower_bound = f32::NAN),
            SSMK_ERR_INVALID_ARGUMENT,
            &["lower_bound = NaN"],
        ),
        (
            "infinite bound",
            Box::new(|g| g.lower_bound = f32::NEG_INFINITY),
            SSMK_ERR_INVALID_ARGUMENT,
            &["lower_bound = -inf"],
        ),
        (
            "b without beta",
            Box::new(|g| g.beta = None),
            SSMK_ERR_INVALID_ARGUMENT,
            &["b is given and beta is NULL"],
        ),
        (
            "beta without b",
            Box::new(|g| g.b = None),
            SSMK_ERR_INVALID_ARGUMENT,
            &["beta is given and b is NULL"],
        ),
        (
            "g not f32",
            Box::new(|g| g.g = Tensor::zeros(DType::BF16, &[3, 4, 16])),
            SSMK_ERR_UNSUPPORTED_DTYPE,
            &["g.dtype = bfloat16"],
        ),
        (
            "A_log not f32",
            Box::new(|g| g.a_log = Tensor::zeros(DType::BF16, &[4])),
            SSMK_ERR_UNSUPPORTED_DTYPE,
            &["A_log.dtype = bfloat16"],
        ),
        (
            "dt_bias not f32",
            Box::new(|g| g.dt_bias = Some(Tensor::zeros(DType::F16, &[4, 16]))),
            SSMK_ERR_UNSUPPORTED_DTYPE,
            &["dt_bias.dtype = float16"],
        ),
        (
            "dt_bias shape",
            Box::new(|g| g.dt_bias = Some(Tensor::zeros(DType::F32, &[4, 15]))),
            SSMK_ERR_INVALID_ARGUMENT,
            &["dt_bias.shape[1] = 15", "16"],
        ),
        (
            "flat dt_bias length",
            Box::new(|g| g.dt_bias = Some(Tensor::zeros(DType::F32, &[63]))),
            SSMK_ERR_INVALID_ARGUMENT,
            &["dt_bias.shape[0] = 63", "64"],
        ),
        (
            "a rank",
            Box::new(|g| g.a = Tensor::zeros(DType::F32, &[3, 64])),
            SSMK_ERR_INVALID_ARGUMENT,
            &["a.ndim = 2", "3"],
        ),
        (
            "a heads",
            Box::new(|g| g.a = Tensor::zeros(DType::F32, &[3, 5, 16])),
            SSMK_ERR_INVALID_ARGUMENT,
            &["a.shape[1] = 5", "4"],
        ),
        (
            "g shape",
            Box::new(|g| g.g = Tensor::zeros(DType::F32, &[3, 4, 8])),
            SSMK_ERR_INVALID_ARGUMENT,
            &["g.shape[2] = 8", "16"],
        ),
        (
            "beta shape",
            Box::new(|g| g.beta = Some(Tensor::zeros(DType::F32, &[2, 4]))),
            SSMK_ERR_INVALID_ARGUMENT,
            &["beta.shape[0] = 2", "3"],
        ),
        (
            "a dtype",
            Box::new(|g| g.a = Tensor::zeros(DType::I32, &[3, 4, 16])),
            SSMK_ERR_UNSUPPORTED_DTYPE,
            &["a.dtype = int32"],
        ),
    ];
    for (what, mutate, status, fragments) in cases {
        let mut gates = Gates::new(3, 4, 16, DType::BF16, 11);
        mutate(&mut gates);
        let (g, beta) = (gates.g.bytes(), gates.beta.as_ref().map(Tensor::bytes));
        let code = gates.call(&Ctx::new(1));
        assert_error(code, status, fragments);
        assert!(gates.g.bytes() == g, "{what}: g written");
        assert!(
            gates.beta.as_ref().map(Tensor::bytes) == beta,
            "{what}: beta written"
        );
    }

    // g viewing a's memory, and beta viewing g's.
    let gates = Gates::new(3, 4, 16, DType::F32, 12);
    let before = gates.a.bytes();
    let (al, a) = (gates.a_log.desc(), gates.a.desc());
    let ctx = Ctx::new(1);
    let mut g = gates.a.desc();
    let code = export(&ctx, Some(&al), &a, None, 0.0, None, &mut g, None);
    assert_error(code, SSMK_ERR_ALIASING, &["g", "a"]);
    assert!(gates.a.bytes() == before);
    let b = gates.b.as_ref().unwrap().desc();
    let mut g = gates.g.desc();
    let mut beta = gates.g.desc();
    beta.ndim = 2;
    let code = export(
        &ctx,
        Some(&al),
        &a,
        None,
        0.0,
        Some(&b),
        &mut g,
        Some(&mut beta),
    );
    assert_error(code, SSMK_ERR_ALIASING, &["beta"]);
    // Required descriptors.
    let code = export(&ctx, None, &a, None, 0.0, None, &mut g, None);
    assert_error(code, SSMK_ERR_NULL_POINTER, &["A_log"]);
}
