//! Validated views to kernel descriptors, and the shape checks every kernel export makes.

use crate::dtype::DType;
use crate::error::Result;
use crate::kernels::strided::Strided;
use crate::tensor::View;

/// The activation and state dtypes.
pub(crate) const FLOATS: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

/// The kernels' view of a validated descriptor (up to four dimensions).
pub(crate) fn strided(v: &View) -> Strided {
    let mut strides = [0usize; 4];
    for (d, s) in strides.iter_mut().enumerate().take(v.ndim.min(4)) {
        *s = v.strides[d];
    }
    Strided {
        ptr: v.ptr,
        dtype: v.dtype,
        strides,
    }
}

/// A float tensor of exactly `shape`; `what` names each dimension for the message.
pub(crate) fn expect_shape(
    v: &View,
    shape: &[usize],
    what: &[&str],
    dtypes: &[DType],
) -> Result<()> {
    v.expect_ndim(shape.len())?;
    for (d, (&n, w)) in shape.iter().zip(what).enumerate() {
        v.expect_dim(d, n, w)?;
    }
    v.expect_dtype(dtypes)
}

/// A recurrent kernel's outputs, `out` and the state pool (read and written in place): each
/// element once, and never memory another tensor of the call uses.
pub(crate) fn expect_outputs_disjoint(
    out: &View,
    state: Option<&View>,
    inputs: &[Option<&View>],
) -> Result<()> {
    out.expect_no_self_overlap()?;
    out.expect_disjoint_from(inputs)?;
    if let Some(st) = state {
        st.expect_no_self_overlap()?;
        st.expect_disjoint_from(inputs)?;
        st.expect_disjoint(out)?;
    }
    Ok(())
}
