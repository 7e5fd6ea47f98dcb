//! Internal error type: a status code plus a message that names the argument and the expected and
//! actual values. The FFI guard turns it into the returned code and the thread-local last error.

use std::fmt;

/// Status codes of the C ABI (ABI.md §1). Numbers are fixed forever; see `ffi::status` for the
/// exported constants, which a test keeps equal to these.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum Status {
    Ok = 0,
    NullPointer = -1,
    InvalidArgument = -2,
    UnsupportedDtype = -3,
    OutOfBounds = -4,
    Overflow = -5,
    Aliasing = -6,
    UnsupportedDevice = -7,
    Allocation = -8,
    Panic = -99,
}

impl Status {
    /// Every status, for tables and tests.
    pub const ALL: [Status; 10] = [
        Status::Ok,
        Status::NullPointer,
        Status::InvalidArgument,
        Status::UnsupportedDtype,
        Status::OutOfBounds,
        Status::Overflow,
        Status::Aliasing,
        Status::UnsupportedDevice,
        Status::Allocation,
        Status::Panic,
    ];

    /// Static NUL-terminated description, as returned by `ssmk_status_str`.
    pub const fn describe(self) -> &'static std::ffi::CStr {
        match self {
            Status::Ok => c"SSMK_OK: success",
            Status::NullPointer => c"SSMK_ERR_NULL_POINTER: a required pointer is NULL",
            Status::InvalidArgument => {
                c"SSMK_ERR_INVALID_ARGUMENT: shape, stride, ndim or value inconsistent"
            }
            Status::UnsupportedDtype => c"SSMK_ERR_UNSUPPORTED_DTYPE: dtype not supported here",
            Status::OutOfBounds => {
                c"SSMK_ERR_OUT_OF_BOUNDS: an index, slot, block id or offset is outside its range"
            }
            Status::Overflow => c"SSMK_ERR_OVERFLOW: a size computation overflows",
            Status::Aliasing => c"SSMK_ERR_ALIASING: an output overlaps an input or itself",
            Status::UnsupportedDevice => c"SSMK_ERR_UNSUPPORTED_DEVICE: device not supported",
            Status::Allocation => c"SSMK_ERR_ALLOCATION: memory allocation failed",
            Status::Panic => c"SSMK_ERR_PANIC: internal error caught (please report)",
        }
    }

    pub fn from_code(code: i32) -> Option<Status> {
        Status::ALL.into_iter().find(|s| *s as i32 == code)
    }
}

/// A failed call: what kind of failure, and a message naming the argument and the values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub status: Status,
    pub message: String,
}

impl Error {
    pub fn new(status: Status, message: impl Into<String>) -> Self {
        Error {
            status,
            message: message.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.status, self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// `bail!(InvalidArgument, "x.shape[1] = {}, expected {}", a, b)` returns that error.
#[macro_export]
macro_rules! bail {
    ($status:ident, $($fmt:tt)*) => {
        return Err($crate::error::Error::new($crate::error::Status::$status, format!($($fmt)*)))
    };
}

/// `ensure!(cond, Status, "...")` bails unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $status:ident, $($fmt:tt)*) => {
        if !$cond {
            $crate::bail!($status, $($fmt)*);
        }
    };
}
