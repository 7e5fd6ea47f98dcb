//! `ssmk_mamba2_scan` with `A` per head.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ssmk_fuzz::recurrent::mamba2_scan(data));
