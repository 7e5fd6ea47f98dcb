//! `ssmk_gated_delta_rule` with one log-decay per key channel (Kimi Delta Attention: `g` `[T, HV, K]`), in both GQA orders.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ssmk_fuzz::recurrent::delta_rule(data, true));
