//! `ssmk_gdn_gating` with hostile descriptors and scalars, against the scalar reference.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ssmk::dtype::DType;
use ssmk_fuzz::call::{Call, Cmp, FLOATS, Fill, Role};
use ssmk_fuzz::exports::GdnGating;
use ssmk_fuzz::input::Input;

fuzz_target!(|data: &[u8]| {
    let input = &mut Input::new(data);
    let mut call = Call::new(input);
    let (n, hv) = (input.range(0, 40), input.range(0, 9));
    let float = |input: &mut Input| input.pick(&FLOATS);
    let dt = float(input);
    let a_log = call.required(
        input,
        "A_log",
        Role::Input,
        dt,
        &[hv],
        Fill::Floats(-2.0, 2.0),
    );
    let dt = float(input);
    let a = call.required(
        input,
        "a",
        Role::Input,
        dt,
        &[n, hv],
        Fill::Floats(-6.0, 6.0),
    );
    let dt = float(input);
    let b_rows = call.dim(input, n);
    let b = call.required(
        input,
        "b",
        Role::Input,
        dt,
        &[b_rows, hv],
        Fill::Floats(-6.0, 6.0),
    );
    let dt = float(input);
    let dt_bias = call.required(
        input,
        "dt_bias",
        Role::Input,
        dt,
        &[hv],
        Fill::Floats(-1.0, 1.0),
    );
    let g_cmp = Cmp::Tol {
        atol: 1e-6,
        rtol: 1e-5,
    };
    let g = call.required(
        input,
        "g",
        Role::Output(g_cmp),
        DType::F32,
        &[n, hv],
        Fill::Floats(-9.0, 9.0),
    );
    let dt = float(input);
    let beta_shape = [n, call.dim(input, hv)];
    let beta = call.required(
        input,
        "beta",
        Role::Output(Cmp::rounding(dt, 1e-6)),
        dt,
        &beta_shape,
        Fill::Floats(-9.0, 9.0),
    );
    let args = GdnGating {
        a_log,
        a,
        b,
        dt_bias,
        softplus_beta: call.scalar(input, &[1.0, 1.0, 0.5, 2.0]),
        softplus_threshold: call.scalar(input, &[20.0, 20.0, 4.0]),
        g,
        beta,
    };
    call.run(GdnGating::NAMES, &|c, ctx| args.invoke(c, ctx));
});
