//! Each export's call, in exactly one place: a target fills in the arguments and the harness
//! calls `invoke` (under the ISA, path and context it chooses, then again for the reference).
//! `NAMES` are the argument names the export's messages use.
// `invoke` passes a context pointer through: the harness's (NULL or from `ssmk_context_create`).
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::ffi::c_void;

use ssmk::ffi::context::ssmk_context;
use ssmk::ffi::conv::{ssmk_causal_conv1d_fwd, ssmk_causal_conv1d_update};
use ssmk::ffi::dplr::ssmk_dplr_delta_rule;
use ssmk::ffi::gdn::{ssmk_gated_delta_rule, ssmk_gdn_gating, ssmk_kda_gating};
use ssmk::ffi::mamba2::ssmk_mamba2_scan;
use ssmk::ffi::memory::{ssmk_batch_memcpy, ssmk_zero_blocks, ssmk_zero_blocks_multi};
use ssmk::ffi::short_conv::ssmk_short_conv;
use ssmk::tensor::ssmk_tensor;

use crate::batch::Checkpoints;
use crate::call::{Call, Id};

pub struct CausalConv1dFwd {
    pub x: Id,
    pub weight: Id,
    pub bias: Option<Id>,
    pub conv_states: Option<Id>,
    pub query_start_loc: Option<Id>,
    pub cache_indices: Option<Id>,
    pub has_initial_state: Option<Id>,
    pub activation: u32,
    pub pad_slot_id: i64,
    pub out: Id,
    pub checkpoints: Checkpoints,
}

impl CausalConv1dFwd {
    pub const NAMES: &[&str] = &[
        "x",
        "weight",
        "bias",
        "conv_states",
        "query_start_loc",
        "cache_indices",
        "has_initial_state",
        "activation",
        "out",
        "checkpoint_offsets",
        "checkpoint_slots",
    ];

    pub fn invoke(&self, c: &Call, ctx: *const ssmk_context) -> i32 {
        unsafe {
            ssmk_causal_conv1d_fwd(
                ctx,
                c.desc(Some(self.x)),
                c.desc(Some(self.weight)),
                c.desc(self.bias),
                c.desc(self.conv_states),
                c.desc(self.query_start_loc),
                c.desc(self.cache_indices),
                c.desc(self.has_initial_state),
                self.activation,
                self.pad_slot_id,
                c.desc(Some(self.out)),
                c.desc(self.checkpoints.offsets),
                c.desc(self.checkpoints.slots),
            )
        }
    }
}

pub struct CausalConv1dUpdate {
    pub x: Id,
    pub conv_states: Option<Id>,
    pub weight: Id,
    pub bias: Option<Id>,
    pub conv_state_indices: Option<Id>,
    pub num_accepted_tokens: Option<Id>,
    pub activation: u32,
    pub pad_slot_id: i64,
    pub out: Id,
}

impl CausalConv1dUpdate {
    pub const NAMES: &[&str] = &[
        "x",
        "conv_states",
        "weight",
        "bias",
        "conv_state_indices",
        "num_accepted_tokens",
        "activation",
        "out",
    ];

    pub fn invoke(&self, c: &Call, ctx: *const ssmk_context) -> i32 {
        unsafe {
            ssmk_causal_conv1d_update(
                ctx,
                c.desc(Some(self.x)),
                c.desc(self.conv_states),
                c.desc(Some(self.weight)),
                c.desc(self.bias),
                c.desc(self.conv_state_indices),
                c.desc(self.num_accepted_tokens),
                self.activation,
                self.pad_slot_id,
                c.desc(Some(self.out)),
            )
        }
    }
}

pub struct ShortConv {
    pub bcx: Id,
    pub weight: Id,
    pub bias: Option<Id>,
    pub conv_states: Option<Id>,
    pub query_start_loc: Option<Id>,
    pub cache_indices: Option<Id>,
    pub has_initial_state: Option<Id>,
    pub pad_slot_id: i64,
    pub out: Id,
    pub checkpoints: Checkpoints,
}

impl ShortConv {
    pub const NAMES: &[&str] = &[
        "bcx",
        "weight",
        "bias",
        "conv_states",
        "query_start_loc",
        "cache_indices",
        "has_initial_state",
        "out",
        "checkpoint_offsets",
        "checkpoint_slots",
    ];

    pub fn invoke(&self, c: &Call, ctx: *const ssmk_context) -> i32 {
        unsafe {
            ssmk_short_conv(
                ctx,
                c.desc(Some(self.bcx)),
                c.desc(Some(self.weight)),
                c.desc(self.bias),
                c.desc(self.conv_states),
                c.desc(self.query_start_loc),
                c.desc(self.cache_indices),
                c.desc(self.has_initial_state),
                self.pad_slot_id,
                c.desc(Some(self.out)),
                c.desc(self.checkpoints.offsets),
                c.desc(self.checkpoints.slots),
            )
        }
    }
}

pub struct GdnGating {
    pub a_log: Option<Id>,
    pub a: Option<Id>,
    pub b: Option<Id>,
    pub dt_bias: Option<Id>,
    pub softplus_beta: f32,
    pub softplus_threshold: f32,
    pub g: Option<Id>,
    pub beta: Option<Id>,
}

impl GdnGating {
    pub const NAMES: &[&str] = &[
        "A_log",
        "a",
        "b",
        "dt_bias",
        "softplus_beta",
        "softplus_threshold",
        "g",
        "beta",
    ];

    pub fn invoke(&self, c: &Call, ctx: *const ssmk_context) -> i32 {
        unsafe {
            ssmk_gdn_gating(
                ctx,
                c.desc(self.a_log),
                c.desc(self.a),
                c.desc(self.b),
                c.desc(self.dt_bias),
                self.softplus_beta,
                self.softplus_threshold,
                c.desc(self.g),
                c.desc(self.beta),
            )
        }
    }
}

pub struct KdaGating {
    pub a_log: Option<Id>,
    pub a: Option<Id>,
    pub dt_bias: Option<Id>,
    pub lower_bound: f32,
    pub b: Option<Id>,
    pub g: Option<Id>,
    pub beta: Option<Id>,
}

impl KdaGating {
    pub const NAMES: &[&str] = &["A_log", "a", "dt_bias", "lower_bound", "b", "g", "beta"];

    pub fn invoke(&self, c: &Call, ctx: *const ssmk_context) -> i32 {
        unsafe {
            ssmk_kda_gating(
                ctx,
                c.desc(self.a_log),
                c.desc(self.a),
                c.desc(self.dt_bias),
                self.lower_bound,
                c.desc(self.b),
                c.desc(self.g),
                c.desc(self.beta),
            )
        }
    }
}

pub struct GatedDeltaRule {
    pub q: Id,
    pub k: Id,
    pub v: Id,
    pub g: Id,
    pub beta: Id,
    pub scale: f32,
    pub state: Option<Id>,
    pub cu_seqlens: Option<Id>,
    pub state_indices: Option<Id>,
    pub has_initial_state: Option<Id>,
    pub num_accepted_tokens: Option<Id>,
    pub flags: u32,
    pub l2norm_eps: f32,
    pub pad_slot_id: i64,
    pub out: Id,
    pub checkpoints: Checkpoints,
}

impl GatedDeltaRule {
    pub const NAMES: &[&str] = &[
        "q",
        "k",
        "v",
        "g",
        "beta",
        "scale",
        "state",
        "cu_seqlens",
        "state_indices",
        "has_initial_state",
        "num_accepted_tokens",
        "flags",
        "l2norm_eps",
        "out",
        "checkpoint_offsets",
        "checkpoint_slots",
    ];

    pub fn invoke(&self, c: &Call, ctx: *const ssmk_context) -> i32 {
        unsafe {
            ssmk_gated_delta_rule(
                ctx,
                c.desc(Some(self.q)),
                c.desc(Some(self.k)),
                c.desc(Some(self.v)),
                c.desc(Some(self.g)),
                c.desc(Some(self.beta)),
                self.scale,
                c.desc(self.state),
                c.desc(self.cu_seqlens),
                c.desc(self.state_indices),
                c.desc(self.has_initial_state),
                c.desc(self.num_accepted_tokens),
                self.flags,
                self.l2norm_eps,
                self.pad_slot_id,
                c.desc(Some(self.out)),
                c.desc(self.checkpoints.offsets),
                c.desc(self.checkpoints.slots),
            )
        }
    }
}

pub struct DplrDeltaRule {
    pub r: Id,
    pub w: Id,
    pub k: Id,
    pub v: Id,
    pub a: Id,
    pub b: Id,
    pub scale: f32,
    pub state: Option<Id>,
    pub cu_seqlens: Option<Id>,
    pub state_indices: Option<Id>,
    pub has_initial_state: Option<Id>,
    pub num_accepted_tokens: Option<Id>,
    pub flags: u32,
    pub pad_slot_id: i64,
    pub out: Id,
    pub checkpoints: Checkpoints,
}

impl DplrDeltaRule {
    pub const NAMES: &[&str] = &[
        "r",
        "w",
        "k",
        "v",
        "a",
        "b",
        "scale",
        "state",
        "cu_seqlens",
        "state_indices",
        "has_initial_state",
        "num_accepted_tokens",
        "flags",
        "out",
        "checkpoint_offsets",
        "checkpoint_slots",
    ];

    pub fn invoke(&self, c: &Call, ctx: *const ssmk_context) -> i32 {
        unsafe {
            ssmk_dplr_delta_rule(
                ctx,
                c.desc(Some(self.r)),
                c.desc(Some(self.w)),
                c.desc(Some(self.k)),
                c.desc(Some(self.v)),
                c.desc(Some(self.a)),
                c.desc(Some(self.b)),
                self.scale,
                c.desc(self.state),
                c.desc(self.cu_seqlens),
                c.desc(self.state_indices),
                c.desc(self.has_initial_state),
                c.desc(self.num_accepted_tokens),
                self.flags,
                self.pad_slot_id,
                c.desc(Some(self.out)),
                c.desc(self.checkpoints.offsets),
                c.desc(self.checkpoints.slots),
            )
        }
    }
}

#[allow(non_snake_case)]
pub struct Mamba2Scan {
    pub x: Id,
    pub dt: Id,
    pub A: Id,
    pub B: Id,
    pub C: Id,
    pub D: Option<Id>,
    pub z: Option<Id>,
    pub dt_bias: Option<Id>,
    pub dt_min: f32,
    pub dt_max: f32,
    pub flags: u32,
    pub state: Option<Id>,
    pub cu_seqlens: Option<Id>,
    pub state_indices: Option<Id>,
    pub has_initial_state: Option<Id>,
    pub num_accepted_tokens: Option<Id>,
    pub pad_slot_id: i64,
    pub out: Id,
    pub checkpoints: Checkpoints,
}

impl Mamba2Scan {
    pub const NAMES: &[&str] = &[
        "x",
        "dt",
        "A",
        "B",
        "C",
        "D",
        "z",
        "dt_bias",
        "dt_min",
        "dt_max",
        "flags",
        "state",
        "cu_seqlens",
        "state_indices",
        "has_initial_state",
        "num_accepted_tokens",
        "out",
        "checkpoint_offsets",
        "checkpoint_slots",
    ];

    pub fn invoke(&self, c: &Call, ctx: *const ssmk_context) -> i32 {
        unsafe {
            ssmk_mamba2_scan(
                ctx,
                c.desc(Some(self.x)),
                c.desc(Some(self.dt)),
                c.desc(Some(self.A)),
                c.desc(Some(self.B)),
                c.desc(Some(self.C)),
                c.desc(self.D),
                c.desc(self.z),
                c.desc(self.dt_bias),
                self.dt_min,
                self.dt_max,
                self.flags,
                c.desc(self.state),
                c.desc(self.cu_seqlens),
                c.desc(self.state_indices),
                c.desc(self.has_initial_state),
                c.desc(self.num_accepted_tokens),
                self.pad_slot_id,
                c.desc(Some(self.out)),
                c.desc(self.checkpoints.offsets),
                c.desc(self.checkpoints.slots),
            )
        }
    }
}

/// `ssmk_batch_memcpy`'s arrays as raw pointers (the target decides what they point to).
pub struct BatchMemcpy {
    pub dst: *const *mut c_void,
    pub src: *const *const c_void,
    pub sizes: *const usize,
    pub n: usize,
}

impl BatchMemcpy {
    pub const NAMES: &[&str] = &["dst", "src", "sizes", "entry"];

    pub fn invoke(&self, ctx: *const ssmk_context) -> i32 {
        unsafe { ssmk_batch_memcpy(ctx, self.dst, self.src, self.sizes, self.n) }
    }
}

pub struct ZeroBlocks {
    pub cache: Option<Id>,
    pub block_ids: Option<Id>,
}

impl ZeroBlocks {
    pub const NAMES: &[&str] = &["cache", "block_ids"];

    pub fn invoke(&self, c: &Call, ctx: *const ssmk_context) -> i32 {
        unsafe { ssmk_zero_blocks(ctx, c.desc(self.cache), c.desc(self.block_ids)) }
    }
}

/// `caches` is an array of descriptor pointers the target builds (NULL entries allowed).
pub struct ZeroBlocksMulti {
    pub caches: *const *mut ssmk_tensor,
    pub n_caches: usize,
    pub block_ids: Option<Id>,
}

impl ZeroBlocksMulti {
    pub const NAMES: &[&str] = &["caches", "cache", "block_ids"];

    pub fn invoke(&self, c: &Call, ctx: *const ssmk_context) -> i32 {
        unsafe { ssmk_zero_blocks_multi(ctx, self.caches, self.n_caches, c.desc(self.block_ids)) }
    }
}
