//! Tensor descriptors: the DLPack-compatible `ssmk_tensor` (ABI.md §2) and its validation into a
//! `View` whose every byte address has been proven to fit the address space. Each check names the
//! argument and the expected and actual values, so `ssmk_last_error_message()` says what to fix.

use std::ffi::c_void;

use crate::dtype::DType;
use crate::error::{Error, Result, Status};
use crate::{bail, ensure};

/// Device of a tensor: `device_type` 1 = CPU, 3 = CUDA host-pinned memory (CPU-addressable).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(non_camel_case_types)]
pub struct ssmk_device {
    pub device_type: i32,
    pub device_id: i32,
}

/// Element type, DLPack's `DLDataType`: float32 = {2, 32, 1}, float16 = {2, 16, 1},
/// bfloat16 = {4, 16, 1}, int32 = {0, 32, 1}, int64 = {0, 64, 1}, bool = {6, 8, 1}, uint8 = {1, 8, 1}.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(non_camel_case_types)]
pub struct ssmk_dtype {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

/// A strided view of caller memory, layout-identical to DLPack's `DLTensor`.
///
/// The library never frees, retains or reallocates `data`, `shape` or `strides`: they are
/// borrowed for the duration of the call only. `strides` are in elements; NULL means compact
/// row-major. Element `(i0, .., in)` lives at `data + byte_offset + sum(i_d * strides[d]) * size`.
/// Strides must be non-negative; `data + byte_offset` must be aligned to the element size.
/// `data` may be NULL only when the tensor has zero elements.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(non_camel_case_types)]
pub struct ssmk_tensor {
    pub data: *mut c_void,
    pub device: ssmk_device,
    pub ndim: i32,
    pub dtype: ssmk_dtype,
    pub shape: *const i64,
    pub strides: *const i64,
    pub byte_offset: u64,
}

impl ssmk_tensor {
    /// A CPU descriptor for Rust callers (tests, benchmarks, embedders): `shape` and `strides`
    /// (elements; `None` = row-major) are borrowed by pointer, so they must outlive every use of
    /// the descriptor.
    pub fn cpu(
        data: *mut c_void,
        dtype: DType,
        shape: &[i64],
        strides: Option<&[i64]>,
    ) -> ssmk_tensor {
        let (code, bits) = dtype.to_dlpack();
        ssmk_tensor {
            data,
            device: ssmk_device {
                device_type: 1,
                device_id: 0,
            },
            ndim: shape.len() as i32,
            dtype: ssmk_dtype {
                code,
                bits,
                lanes: 1,
            },
            shape: shape.as_ptr(),
            strides: strides.map_or(std::ptr::null(), <[i64]>::as_ptr),
            byte_offset: 0,
        }
    }
}

/// Most dimensions any ssmk argument has (the `[S, HV, K, V]` state has four).
pub const MAX_NDIM: usize = 6;

/// A validated tensor. Construction proves: known dtype and device, non-negative shape and
/// strides, no size overflow, aligned base, and that every element lies in `[lo, hi)`.
#[derive(Clone, Copy, Debug)]
pub struct View {
    pub name: &'static str,
    /// Address of element `(0, .., 0)`; dangling (but aligned) when the view is empty.
    pub ptr: *mut u8,
    pub dtype: DType,
    pub ndim: usize,
    pub shape: [usize; MAX_NDIM],
    /// In elements.
    pub strides: [usize; MAX_NDIM],
    pub numel: usize,
    /// Byte range covering every element; `lo == hi` when empty.
    pub lo: usize,
    pub hi: usize,
}

// SAFETY: a View is a description of caller memory; the kernels decide how threads share it.
unsafe impl Send for View {}
unsafe impl Sync for View {}

impl View {
    /// Validates an optional descriptor: NULL → `None`.
    ///
    /// # Safety
    /// `t`, if non-NULL, must point to a readable `ssmk_tensor` whose `shape`/`strides` (when
    /// non-NULL) hold `ndim` readable entries; `data` must describe memory the caller owns.
    pub unsafe fn optional(name: &'static str, t: *const ssmk_tensor) -> Result<Option<View>> {
        if t.is_null() {
            return Ok(None);
        }
        // SAFETY: non-NULL, and the caller promises it points to a descriptor.
        let t = unsafe { &*t };
        unsafe { View::parse(name, t) }.map(Some)
    }

    /// Validates a required descriptor: NULL → `SSMK_ERR_NULL_POINTER`.
    ///
    /// # Safety
    /// As for [`View::optional`].
    pub unsafe fn required(name: &'static str, t: *const ssmk_tensor) -> Result<View> {
        match unsafe { View::optional(name, t) }? {
            Some(v) => Ok(v),
            None => bail!(NullPointer, "{name} is NULL, expected a tensor descriptor"),
        }
    }

    unsafe fn parse(name: &'static str, t: &ssmk_tensor) -> Result<View> {
        ensure!(
            t.device.device_type == 1 || t.device.device_type == 3,
            UnsupportedDevice,
            "{name}.device.device_type = {}, expected 1 (CPU) or 3 (CUDA host-pinned)",
            t.device.device_type
        );
        let dtype = match DType::from_dlpack(t.dtype.code, t.dtype.bits, t.dtype.lanes) {
            Some(d) => d,
            None => bail!(
                UnsupportedDtype,
                "{name}.dtype = {{code {}, bits {}, lanes {}}}, expected float32, float16, bfloat16, int32, int64, bool or uint8 with lanes 1",
                t.dtype.code,
                t.dtype.bits,
                t.dtype.lanes
            ),
        };
        ensure!(
            (0..=MAX_NDIM as i32).contains(&t.ndim),
            InvalidArgument,
            "{name}.ndim = {}, expected 0..={MAX_NDIM}",
            t.ndim
        );
        let ndim = t.ndim as usize;
        ensure!(
            ndim == 0 || !t.shape.is_null(),
            NullPointer,
            "{name}.shape is NULL with ndim = {ndim}"
        );
        let mut shape = [0usize; MAX_NDIM];
        let mut strides = [0usize; MAX_NDIM];
        for d in 0..ndim {
            // SAFETY: the caller promises `ndim` readable entries.
            let s = unsafe { *t.shape.add(d) };
            ensure!(
                s >= 0,
                InvalidArgument,
                "{name}.shape[{d}] = {s}, expected >= 0"
            );
            shape[d] = usize::try_from(s).map_err(|_| {
                Error::new(
                    Status::Overflow,
                    format!("{name}.shape[{d}] = {s} does not fit size_t"),
                )
            })?;
        }
        let overflow = || {
            Error::new(
                Status::Overflow,
                format!("{name}: size of shape {:?} overflows", &shape[..ndim]),
            )
        };
        if t.strides.is_null() {
            let mut acc = 1usize;
            for d in (0..ndim).rev() {
                strides[d] = acc;
                acc = acc.checked_mul(shape[d].max(1)).ok_or_else(overflow)?;
            }
        } else {
            for d in 0..ndim {
                // SAFETY: as above.
                let s = unsafe { *t.strides.add(d) };
                ensure!(
                    s >= 0,
                    InvalidArgument,
                    "{name}.strides[{d}] = {s}, expected >= 0"
                );
                strides[d] = usize::try_from(s).map_err(|_| overflow())?;
            }
        }
        let mut numel = 1usize;
        for &s in &shape[..ndim] {
            numel = numel.checked_mul(s).ok_or_else(overflow)?;
        }
        let size = dtype.size();
        let offset = usize::try_from(t.byte_offset).map_err(|_| overflow())?;
        if numel == 0 {
            // Nothing is ever read or written; keep an aligned dangling pointer.
            return Ok(View {
                name,
                ptr: size as *mut u8,
                dtype,
                ndim,
                shape,
                strides,
                numel,
                lo: 0,
                hi: 0,
            });
        }
        ensure!(
            !t.data.is_null(),
            NullPointer,
            "{name}.data is NULL, expected memory for {numel} elements"
        );
        let mut last = 0usize;
        for d in 0..ndim {
            let term = (shape[d] - 1)
                .checked_mul(strides[d])
                .ok_or_else(overflow)?;
            last = last.checked_add(term).ok_or_else(overflow)?;
        }
        let bytes = last
            .checked_add(1)
            .and_then(|n| n.checked_mul(size))
            .ok_or_else(overflow)?;
        let lo = (t.data as usize).checked_add(offset).ok_or_else(overflow)?;
        let hi = lo.checked_add(bytes).ok_or_else(overflow)?;
        ensure!(
            hi <= isize::MAX as usize,
            Overflow,
            "{name}: byte range [{lo:#x}, {hi:#x}) exceeds the address space"
        );
        ensure!(
            lo % size == 0,
            InvalidArgument,
            "{name}: data + byte_offset = {lo:#x} is not aligned to its {size}-byte elements"
        );
        Ok(View {
            name,
            ptr: lo as *mut u8,
            dtype,
            ndim,
            shape,
            strides,
            numel,
            lo,
            hi,
        })
    }

    pub fn dims(&self) -> &[usize] {
        &self.shape[..self.ndim]
    }

    pub fn is_empty(&self) -> bool {
        self.numel == 0
    }

    pub fn expect_ndim(&self, expected: usize) -> Result<()> {
        ensure!(
            self.ndim == expected,
            InvalidArgument,
            "{}.ndim = {}, expected {expected} (shape {:?})",
            self.name,
            self.ndim,
            self.dims()
        );
        Ok(())
    }

    /// `shape[d] == expected`, where `what` names the expected quantity (e.g. "dim = D").
    pub fn expect_dim(&self, d: usize, expected: usize, what: &str) -> Result<()> {
        ensure!(
            self.shape[d] == expected,
            InvalidArgument,
            "{}.shape[{d}] = {}, expected {what} = {expected}",
            self.name,
            self.shape[d]
        );
        Ok(())
    }

    pub fn expect_dtype(&self, allowed: &[DType]) -> Result<()> {
        if !allowed.contains(&self.dtype) {
            let names: Vec<&str> = allowed.iter().map(|d| d.name()).collect();
            bail!(
                UnsupportedDtype,
                "{}.dtype = {}, expected {}",
                self.name,
                self.dtype.name(),
                names.join(" or ")
            );
        }
        Ok(())
    }

    /// Byte ranges intersect (empty views overlap nothing). Conservative: two interleaved strided
    /// views of one buffer count as overlapping.
    pub fn overlaps(&self, other: &View) -> bool {
        self.lo < self.hi && other.lo < other.hi && self.lo < other.hi && other.lo < self.hi
    }

    /// `SSMK_ERR_ALIASING` when this (output) view overlaps `input`.
    pub fn expect_disjoint(&self, input: &View) -> Result<()> {
        ensure!(
            !self.overlaps(input),
            Aliasing,
            "{} bytes [{:#x}, {:#x}) overlap {} bytes [{:#x}, {:#x}), expected disjoint buffers",
            self.name,
            self.lo,
            self.hi,
            input.name,
            input.lo,
            input.hi
        );
        Ok(())
    }

    /// [`View::expect_disjoint`] for each given input (`None` = a NULL optional tensor).
    pub fn expect_disjoint_from(&self, inputs: &[Option<&View>]) -> Result<()> {
        for input in inputs.iter().flatten() {
            self.expect_disjoint(input)?;
        }
        Ok(())
    }

    /// `SSMK_ERR_ALIASING` unless distinct indices address distinct elements (required of every
    /// output). Proven by sorting the dimensions by stride: each stride must step past the whole
    /// extent of the smaller ones.
    pub fn expect_no_self_overlap(&self) -> Result<()> {
        if self.numel <= 1 {
            return Ok(());
        }
        let mut dims: Vec<(usize, usize)> = (0..self.ndim)
            .filter(|&d| self.shape[d] > 1)
            .map(|d| (self.strides[d], self.shape[d]))
            .collect();
        dims.sort_unstable();
        let mut extent = 1usize; // elements spanned by the dimensions seen so far
        for (stride, len) in dims {
            ensure!(
                stride >= extent,
                Aliasing,
                "{}: strides {:?} with shape {:?} make distinct elements share memory",
                self.name,
                &self.strides[..self.ndim],
                self.dims()
            );
            extent += stride * (len - 1);
        }
        Ok(())
    }

    /// Pointer to the element at `index` (no bounds check; callers index within `dims()`).
    #[inline(always)]
    pub fn at<T>(&self, index: &[usize]) -> *mut T {
        let mut off = 0usize;
        for (i, s) in index.iter().zip(&self.strides) {
            off += i * s;
        }
        self.ptr.cast::<T>().wrapping_add(off)
    }

    /// Reads a 1-D int32/int64 tensor of `len` entries into `i64`s.
    pub fn read_indices(&self, len: usize, what: &str) -> Result<Vec<i64>> {
        self.expect_dtype(&[DType::I32, DType::I64])?;
        self.expect_ndim(1)?;
        self.expect_dim(0, len, what)?;
        Ok(self.read_ints(len))
    }

    /// Reads a 2-D int32/int64 tensor `[rows, cols]` row by row.
    pub fn read_indices_2d(&self) -> Result<Vec<i64>> {
        self.expect_dtype(&[DType::I32, DType::I64])?;
        self.expect_ndim(2)?;
        let (r, c) = (self.shape[0], self.shape[1]);
        let mut out = Vec::with_capacity(r * c);
        for i in 0..r {
            for j in 0..c {
                out.push(self.int_at(&[i, j]));
            }
        }
        Ok(out)
    }

    /// Reads a 1-D bool/uint8/int32/int64 mask of `len` entries (non-zero = true).
    pub fn read_mask(&self, len: usize, what: &str) -> Result<Vec<bool>> {
        self.expect_dtype(&[DType::Bool, DType::U8, DType::I32, DType::I64])?;
        self.expect_ndim(1)?;
        self.expect_dim(0, len, what)?;
        Ok(self.read_ints(len).into_iter().map(|v| v != 0).collect())
    }

    fn read_ints(&self, len: usize) -> Vec<i64> {
        (0..len).map(|i| self.int_at(&[i])).collect()
    }

    fn int_at(&self, index: &[usize]) -> i64 {
        // SAFETY: `index` is within `dims()` (callers check shape first), so the element lies in
        // the validated range and is aligned.
        unsafe {
            match self.dtype {
                DType::I32 => self.at::<i32>(index).read() as i64,
                DType::I64 => self.at::<i64>(index).read(),
                DType::Bool | DType::U8 => self.at::<u8>(index).read() as i64,
                _ => unreachable!("int_at on {:?}", self.dtype),
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Descriptors over owned buffers, for unit tests.
    use super::*;

    pub struct Owned {
        pub shape: Vec<i64>,
        pub strides: Option<Vec<i64>>,
        pub tensor: ssmk_tensor,
    }

    pub fn describe(
        data: *mut c_void,
        dtype: DType,
        shape: &[i64],
        strides: Option<&[i64]>,
    ) -> Box<Owned> {
        let mut o = Box::new(Owned {
            shape: shape.to_vec(),
            strides: strides.map(|s| s.to_vec()),
            tensor: ssmk_tensor::cpu(data, dtype, &[], None),
        });
        o.tensor = ssmk_tensor::cpu(data, dtype, &o.shape, o.strides.as_deref());
        o
    }
}

#[cfg(test)]
mod tests {
    use super::testing::describe;
    use super::*;

    fn parse(t: &ssmk_tensor) -> Result<View> {
        unsafe { View::required("x", t) }
    }

    #[test]
    fn row_major_and_strided() {
        let mut buf = vec![0f32; 24];
        let d = describe(buf.as_mut_ptr().cast(), DType::F32, &[2, 3, 4], None);
        let v = parse(&d.tensor).unwrap();
        assert_eq!(v.strides[..3], [12, 4, 1]);
        assert_eq!(v.hi - v.lo, 96);
        let d = describe(buf.as_mut_ptr().cast(), DType::F32, &[3, 4], Some(&[1, 3]));
        let v = parse(&d.tensor).unwrap();
        assert_eq!(v.hi - v.lo, 48);
        v.expect_no_self_overlap().unwrap();
    }

    #[test]
    fn rejects_bad_descriptors() {
        let mut buf = vec![0u16; 8];
        let p = buf.as_mut_ptr().cast();
        let status = |shape: &[i64], strides: Option<&[i64]>, f: &dyn Fn(&mut ssmk_tensor)| {
            let mut d = describe(p, DType::BF16, shape, strides);
            f(&mut d.tensor);
            parse(&d.tensor).map(|_| ()).map_err(|e| e.status)
        };
        assert_eq!(status(&[2, 4], None, &|_| {}), Ok(()));
        assert_eq!(
            status(&[-1, 4], None, &|_| {}),
            Err(Status::InvalidArgument)
        );
        assert_eq!(
            status(&[2, 4], Some(&[4, -1]), &|_| {}),
            Err(Status::InvalidArgument)
        );
        assert_eq!(
            status(&[2, 4], None, &|t| t.device.device_type = 2),
            Err(Status::UnsupportedDevice)
        );
        assert_eq!(
            status(&[2, 4], None, &|t| t.dtype.lanes = 4),
            Err(Status::UnsupportedDtype)
        );
        assert_eq!(
            status(&[2, 4], None, &|t| t.dtype.code = 9),
            Err(Status::UnsupportedDtype)
        );
        assert_eq!(
            status(&[2, 4], None, &|t| t.ndim = 7),
            Err(Status::InvalidArgument)
        );
        assert_eq!(
            status(&[2, 4], None, &|t| t.ndim = -1),
            Err(Status::InvalidArgument)
        );
        assert_eq!(
            status(&[2, 4], None, &|t| t.data = std::ptr::null_mut()),
            Err(Status::NullPointer)
        );
        assert_eq!(
            status(&[0, 4], None, &|t| t.data = std::ptr::null_mut()),
            Ok(())
        );
        assert_eq!(
            status(&[2, 4], None, &|t| t.shape = std::ptr::null()),
            Err(Status::NullPointer)
        );
        assert_eq!(
            status(&[2, 4], None, &|t| t.byte_offset = 1),
            Err(Status::InvalidArgument)
        );
        assert_eq!(status(&[i64::MAX, 4], None, &|_| {}), Err(Status::Overflow));
        assert_eq!(
            status(&[2, 4], Some(&[i64::MAX / 2, 1]), &|_| {}),
            Err(Status::Overflow)
        );
        assert_eq!(
            status(&[2, 4], None, &|t| t.byte_offset = u64::MAX - 4),
            Err(Status::Overflow)
        );
    }

    #[test]
    fn messages_name_argument_and_values() {
        let mut buf = vec![0f32; 8];
        let d = describe(buf.as_mut_ptr().cast(), DType::F32, &[2, 4], None);
        let v = parse(&d.tensor).unwrap();
        let e = v.expect_dim(1, 8, "dim = D").unwrap_err();
        assert_eq!(e.message, "x.shape[1] = 4, expected dim = D = 8");
        let e = v.expect_dtype(&[DType::BF16]).unwrap_err();
        assert_eq!(e.status, Status::UnsupportedDtype);
        assert!(e.message.contains("float32") && e.message.contains("bfloat16"));
    }

    #[test]
    fn self_overlap_and_aliasing() {
        let mut buf = vec![0f32; 16];
        let p: *mut c_void = buf.as_mut_ptr().cast();
        let d = describe(p, DType::F32, &[4, 4], Some(&[0, 1]));
        assert_eq!(
            parse(&d.tensor)
                .unwrap()
                .expect_no_self_overlap()
                .unwrap_err()
                .status,
            Status::Aliasing
        );
        let d = describe(p, DType::F32, &[2, 3], Some(&[2, 1]));
        assert!(parse(&d.tensor).unwrap().expect_no_self_overlap().is_err());
        let a = describe(p, DType::F32, &[2, 4], None);
        let b = describe(p.wrapping_byte_add(28), DType::F32, &[2], None);
        let c = describe(p.wrapping_byte_add(32), DType::F32, &[2], None);
        let (a, b, c) = (
            parse(&a.tensor).unwrap(),
            parse(&b.tensor).unwrap(),
            parse(&c.tensor).unwrap(),
        );
        assert!(a.overlaps(&b) && !a.overlaps(&c));
        assert_eq!(c.expect_disjoint(&a).map_err(|e| e.status), Ok(()));
        assert_eq!(b.expect_disjoint(&a).unwrap_err().status, Status::Aliasing);
    }
}
