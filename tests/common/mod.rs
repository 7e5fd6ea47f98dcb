//! Shared helpers for the integration tests: owned tensors that hand out `ssmk_tensor`
//! descriptors, deterministic pseudo-random data, and error assertions.
#![allow(dead_code)]

pub mod native;
pub mod recurrent;

use std::ffi::CStr;

use half::{bf16, f16};
use ssmk::dtype::{DType, Element};
use ssmk::ffi::context::{ssmk_context, ssmk_context_create, ssmk_context_destroy};
use ssmk::runtime::{Isa, with_isa};
use ssmk::tensor::ssmk_tensor;

/// An owned ssmk context, destroyed on drop.
pub struct Ctx(pub *mut ssmk_context);

impl Ctx {
    pub fn new(threads: u32) -> Ctx {
        Ctx(ssmk_context_create(threads))
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        unsafe { ssmk_context_destroy(self.0) }
    }
}

/// A tensor owning its bytes and its shape/strides.
#[derive(Clone)]
pub struct Tensor {
    pub dtype: DType,
    pub shape: Vec<i64>,
    pub strides: Option<Vec<i64>>,
    /// Backing storage, u64 words so every dtype is aligned.
    pub storage: Vec<u64>,
}

impl Tensor {
    /// Compact row-major tensor of zeros.
    pub fn zeros(dtype: DType, shape: &[usize]) -> Tensor {
        let numel: usize = shape.iter().product();
        Tensor::with_layout(dtype, shape, None, numel)
    }

    /// Strided tensor over `span_elems` elements of zeroed storage.
    pub fn with_layout(
        dtype: DType,
        shape: &[usize],
        strides: Option<&[usize]>,
        span_elems: usize,
    ) -> Tensor {
        let bytes = span_elems * dtype.size();
        Tensor {
            dtype,
            shape: shape.iter().map(|&s| s as i64).collect(),
            strides: strides.map(|s| s.iter().map(|&x| x as i64).collect()),
            storage: vec![0u64; bytes.div_ceil(8).max(1)],
        }
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().map(|&s| s as usize).product()
    }

    /// Strides in elements (explicit or row-major).
    pub fn elem_strides(&self) -> Vec<usize> {
        match &self.strides {
            Some(s) => s.iter().map(|&x| x as usize).collect(),
            None => {
                let mut st = vec![1usize; self.shape.len()];
                for d in (0..self.shape.len().saturating_sub(1)).rev() {
                    st[d] = st[d + 1] * self.shape[d + 1] as usize;
                }
                st
            }
        }
    }

    /// Without allocating: the reference loops call this for every element.
    fn elem_offset(&self, index: &[usize]) -> usize {
        match &self.strides {
            Some(s) => index.iter().zip(s).map(|(&i, &s)| i * s as usize).sum(),
            None => index
                .iter()
                .zip(&self.shape)
                .fold(0, |off, (&i, &n)| off * n as usize + i),
        }
    }

    /// Every byte of the backing storage (for "nothing was written" checks).
    pub fn bytes(&self) -> Vec<u8> {
        unsafe {
            std::slice::from_raw_parts(self.storage.as_ptr().cast::<u8>(), self.storage.len() * 8)
        }
        .to_vec()
    }

    pub fn base(&self) -> *mut u8 {
        self.storage.as_ptr().cast::<u8>().cast_mut()
    }

    /// The DLPack descriptor; valid while `self` lives and is not moved.
    pub fn desc(&self) -> ssmk_tensor {
        ssmk_tensor::cpu(
            self.base().cast(),
            self.dtype,
            &self.shape,
            self.strides.as_deref(),
        )
    }

    /// Element as f64 (floats and ints).
    pub fn get(&self, index: &[usize]) -> f64 {
        let p = unsafe { self.base().add(self.elem_offset(index) * self.dtype.size()) };
        unsafe {
            match self.dtype {
                DType::F32 => p.cast::<f32>().read() as f64,
                DType::BF16 => p.cast::<bf16>().read().to_f32() as f64,
                DType::F16 => p.cast::<f16>().read().to_f32() as f64,
                DType::I32 => p.cast::<i32>().read() as f64,
                DType::I64 => p.cast::<i64>().read() as f64,
                DType::Bool | DType::U8 => p.read() as f64,
            }
        }
    }

    /// Stores `v`, rounded to the dtype (RNE for floats).
    pub fn set(&mut self, index: &[usize], v: f64) {
        let p = unsafe { self.base().add(self.elem_offset(index) * self.dtype.size()) };
        unsafe {
            match self.dtype {
                DType::F32 => p.cast::<f32>().write(v as f32),
                DType::BF16 => p
                    .cast::<bf16>()
                    .write(<bf16 as Element>::from_f32(v as f32)),
                DType::F16 => p.cast::<f16>().write(<f16 as Element>::from_f32(v as f32)),
                DType::I32 => p.cast::<i32>().write(v as i32),
                DType::I64 => p.cast::<i64>().write(v as i64),
                DType::Bool | DType::U8 => p.write(v as u8),
            }
        }
    }

    /// Stores raw bits (the low 16 for 16-bit dtypes), e.g. a NaN payload `set` would change.
    pub fn set_bits(&mut self, index: &[usize], bits: u32) {
        let p = unsafe { self.base().add(self.elem_offset(index) * self.dtype.size()) };
        unsafe {
            match self.dtype.size() {
                4 => p.cast::<u32>().write(bits),
                2 => p.cast::<u16>().write(bits as u16),
                n => unreachable!("{n}-byte float"),
            }
        }
    }

    /// Every logical index, row-major.
    pub fn indices(&self) -> Vec<Vec<usize>> {
        let dims: Vec<usize> = self.shape.iter().map(|&s| s as usize).collect();
        let mut out = Vec::with_capacity(self.numel());
        if dims.contains(&0) {
            return out;
        }
        let mut idx = vec![0usize; dims.len()];
        loop {
            out.push(idx.clone());
            let mut d = dims.len();
            loop {
                if d == 0 {
                    return out;
                }
                d -= 1;
                idx[d] += 1;
                if idx[d] < dims[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
    }

    /// Fills with uniform values in `[-scale, scale)` from `seed` (rounded to the dtype).
    pub fn fill_random(&mut self, seed: u64, scale: f64) -> &mut Self {
        let mut rng = Rng::new(seed);
        for idx in self.indices() {
            let v = rng.uniform() * 2.0 * scale - scale;
            self.set(&idx, v);
        }
        self
    }

    /// A 1-D int/bool tensor from values.
    pub fn ints(dtype: DType, values: &[i64]) -> Tensor {
        let mut t = Tensor::zeros(dtype, &[values.len()]);
        for (i, &v) in values.iter().enumerate() {
            t.set(&[i], v as f64);
        }
        t
    }

    /// All elements as f64, row-major.
    pub fn to_vec(&self) -> Vec<f64> {
        self.indices().iter().map(|i| self.get(i)).collect()
    }
}

/// The sequence-length lists every recurrent-kernel test covers: one token, a few, and lengths
/// around one and two 64-token chunks / vector blocks, plus a long odd one.
pub const SEQ_LEN_LISTS: [&[usize]; 8] = [
    &[1],
    &[1, 2, 3],
    &[63],
    &[64],
    &[65],
    &[63, 64, 65],
    &[127, 128, 129],
    &[273],
];

/// Whether the suite runs its small-shape mode (`SSMK_TEST_SHAPES=small`): the AVX-512 emulation
/// lane sets it, since the emulator runs 512-bit code at a few million instructions a second.
/// It keeps every code path (SIMD tails, chunk boundaries, decodes beside prefills) and drops the
/// repetitions at larger sizes.
pub fn small_shapes() -> bool {
    std::env::var("SSMK_TEST_SHAPES").is_ok_and(|v| v == "small")
}

/// `full` normally, `small` in the small-shape mode.
pub fn sized<T>(full: T, small: T) -> T {
    if small_shapes() { small } else { full }
}

/// Whether case `n` of a product of cases runs: every case normally, one in `every` in the
/// small-shape mode (with `every` coprime to the product's axes the kept cases still rotate
/// through every option of each axis).
pub fn sampled(n: u64, every: u64) -> bool {
    !small_shapes() || n.is_multiple_of(every)
}

/// xorshift64*: deterministic data for reproducible tests.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// The message of the last failed call on this thread.
/// `call()` with the kernels of `isa` forced, or with the active ones.
pub fn with_optional_isa<R>(isa: Option<Isa>, call: impl FnOnce() -> R) -> R {
    match isa {
        Some(isa) => with_isa(isa, call),
        None => call(),
    }
}

pub fn last_error() -> String {
    unsafe { CStr::from_ptr(ssmk::ffi::status::ssmk_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

/// Asserts a call failed with `status` and a message containing every fragment.
pub fn assert_error(code: i32, status: i32, fragments: &[&str]) {
    let msg = last_error();
    assert_eq!(code, status, "expected status {status}, got {code}: {msg}");
    for f in fragments {
        assert!(msg.contains(f), "message {msg:?} lacks {f:?}");
    }
}
