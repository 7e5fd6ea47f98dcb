//! Owned, pre-faulted buffers with DLPack descriptors, filled with deterministic data.

use ssmk::dtype::{DType, Element};
use ssmk::tensor::ssmk_tensor;

/// A compact row-major tensor owning its storage, in 64-byte lines: runtimes allocate their
/// tensors so (torch's CPU allocator and ggml's buffers), where a `Vec` of this size would start
/// 16 bytes into its page and split a vector load in two at every other cache line (measured on
/// Zen 4: a B = 1 Mamba-2 decode from cache 1.2x slower so).
pub struct Buf {
    pub dtype: DType,
    pub shape: Vec<i64>,
    storage: Vec<Line>,
}

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u64; 8]);

impl Buf {
    /// Zeros, with every page touched so timing never includes first-touch faults.
    pub fn zeros(dtype: DType, shape: &[usize]) -> Buf {
        let bytes = shape.iter().product::<usize>() * dtype.size();
        let mut storage = vec![Line([0; 8]); bytes.div_ceil(64).max(1)];
        for i in (0..storage.len()).step_by(64) {
            // SAFETY: in bounds; volatile so the store that faults the page in is not elided.
            unsafe { std::ptr::write_volatile(storage.as_mut_ptr().add(i), Line([0; 8])) };
        }
        Buf {
            dtype,
            shape: shape.iter().map(|&s| s as i64).collect(),
            storage,
        }
    }

    /// Uniform values in `[-scale, scale)` from a fixed seed, rounded to the dtype.
    pub fn random(dtype: DType, shape: &[usize], seed: u64, scale: f32) -> Buf {
        Buf::uniform(dtype, shape, seed, -scale, scale)
    }

    /// Uniform values in `[lo, hi)` from a fixed seed, rounded to the dtype.
    pub fn uniform(dtype: DType, shape: &[usize], seed: u64, lo: f32, hi: f32) -> Buf {
        let mut b = Buf::zeros(dtype, shape);
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let n = b.numel();
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            lo + (s >> 40) as f32 / (1u64 << 24) as f32 * (hi - lo)
        };
        let p = b.storage.as_mut_ptr().cast::<u8>();
        // SAFETY: `n` elements of `dtype` fit the storage by construction.
        unsafe {
            match dtype {
                DType::F32 => (0..n).for_each(|i| p.cast::<f32>().add(i).write(next())),
                DType::BF16 => (0..n).for_each(|i| {
                    p.cast::<half::bf16>()
                        .add(i)
                        .write(Element::from_f32(next()))
                }),
                DType::F16 => (0..n).for_each(|i| {
                    p.cast::<half::f16>()
                        .add(i)
                        .write(Element::from_f32(next()))
                }),
                other => panic!("Buf::random on {other:?}"),
            }
        }
        b
    }

    /// A 1-D int64 tensor.
    pub fn ints(values: &[i64]) -> Buf {
        let mut b = Buf::zeros(DType::I64, &[values.len()]);
        let p = b.storage.as_mut_ptr().cast::<i64>();
        for (i, &v) in values.iter().enumerate() {
            // SAFETY: one i64 per entry, within the storage (aligned: lines of 64 bytes).
            unsafe { p.add(i).write(v) };
        }
        b
    }

    /// A 1-D bool tensor.
    pub fn mask(values: &[bool]) -> Buf {
        let mut b = Buf::zeros(DType::Bool, &[values.len()]);
        let p = b.storage.as_mut_ptr().cast::<u8>();
        for (i, &v) in values.iter().enumerate() {
            // SAFETY: one byte per entry, within the storage.
            unsafe { p.add(i).write(v as u8) };
        }
        b
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product::<i64>() as usize
    }

    pub fn bytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.storage.as_ptr().cast::<u8>().cast_mut()
    }

    /// Descriptor; valid while `self` lives and is not moved.
    pub fn desc(&self) -> ssmk_tensor {
        ssmk_tensor::cpu(self.as_ptr().cast(), self.dtype, &self.shape, None)
    }
}
