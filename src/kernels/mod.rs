//! The math. Each family has a plain portable `reference` and SIMD variants picked once per
//! process from the active instruction set; nothing here knows about C descriptors.

pub mod conv;
pub mod gdn;
pub mod memory;
pub mod simd;
