//! `ssmk_kda_gating` (both gate forms, `dt_bias` `[HV, K]`, `[HV*K]` or NULL, `b`/`beta` both,
//! neither or one) with hostile descriptors and scalars, against the scalar reference.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ssmk::dtype::DType;
use ssmk_fuzz::call::{Call, Cmp, FLOATS, Fill, Role};
use ssmk_fuzz::exports::KdaGating;
use ssmk_fuzz::input::Input;

fuzz_target!(|data: &[u8]| {
    let input = &mut Input::new(data);
    let mut call = Call::new(input);
    let (n, hv, k) = (input.range(0, 24), input.range(0, 5), input.range(0, 40));
    let a_log = call.required(
        input,
        "A_log",
        Role::Input,
        DType::F32,
        &[hv],
        Fill::Floats(-2.0, 2.0),
    );
    let dt = input.pick(&FLOATS);
    let a = call.required(
        input,
        "a",
        Role::Input,
        dt,
        &[n, hv, k],
        Fill::Floats(-30.0, 30.0),
    );
    let bias_shape: Vec<usize> = if input.chance(96) {
        vec![hv * k]
    } else {
        vec![hv, k]
    };
    let dt_bias = call.optional(
        input,
        192,
        "dt_bias",
        Role::Input,
        DType::F32,
        &bias_shape,
        Fill::Floats(-2.0, 2.0),
    );
    let lower_bound = call.scalar(input, &[0.0, 0.0, -5.0, -1.0]);
    let (with_b, with_beta) = match input.below(8) {
        0 if call.hostile => (true, false),
        1 if call.hostile => (false, true),
        2 | 3 => (false, false),
        _ => (true, true),
    };
    let dt = input.pick(&FLOATS);
    let b = if with_b {
        Some(call.tensor(
            input,
            "b",
            Role::Input,
            dt,
            &[n, hv],
            Fill::Floats(-6.0, 6.0),
        ))
    } else {
        None
    };
    let g_cmp = Cmp::Tol {
        atol: 1e-6,
        rtol: 1e-5,
    };
    let g_heads = call.dim(input, hv);
    let g = call.required(
        input,
        "g",
        Role::Output(g_cmp),
        DType::F32,
        &[n, g_heads, k],
        Fill::Floats(-9.0, 9.0),
    );
    let dt = input.pick(&FLOATS);
    let beta = if with_beta {
        Some(call.tensor(
            input,
            "beta",
            Role::Output(Cmp::rounding(dt, 1e-6)),
            dt,
            &[n, hv],
            Fill::Floats(-9.0, 9.0),
        ))
    } else {
        None
    };
    let args = KdaGating {
        a_log,
        a,
        dt_bias,
        lower_bound,
        b,
        g,
        beta,
    };
    call.run(KdaGating::NAMES, &|c, ctx| args.invoke(c, ctx));
});
