//! `ssmk_dplr_delta_rule` (RWKV-7's generalized delta rule), log-form and linear `w`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ssmk_fuzz::recurrent::dplr_delta_rule(data));
