//! The one boundary every export goes through: panics are caught (never unwound into C), the
//! result becomes a status code, and the thread-local last-error message is set (empty on success).

use std::cell::RefCell;
use std::ffi::c_char;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::error::{Result, Status};

thread_local! {
    /// NUL-terminated message of the last ssmk call on this thread.
    static LAST_ERROR: RefCell<Vec<u8>> = RefCell::new(vec![0]);
}

fn set_last_error(message: &str) {
    LAST_ERROR.with(|m| {
        let mut m = m.borrow_mut();
        m.clear();
        m.extend(message.bytes().filter(|&b| b != 0));
        m.push(0);
    });
}

/// Pointer to this thread's last message; valid until the next ssmk call on this thread.
pub(crate) fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|m| m.borrow().as_ptr().cast())
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("unknown panic payload")
}

/// Runs a fallible export body: `Ok` → `SSMK_OK` and an empty message, `Err` → its status and
/// message, panic → `SSMK_ERR_PANIC` with the panic text.
pub(crate) fn guard(body: impl FnOnce() -> Result<()>) -> i32 {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => {
            set_last_error("");
            Status::Ok as i32
        }
        Ok(Err(e)) => {
            set_last_error(&e.message);
            e.status as i32
        }
        Err(payload) => {
            set_last_error(&format!(
                "internal panic caught at the C boundary: {}",
                panic_text(&*payload)
            ));
            Status::Panic as i32
        }
    }
}

/// For exports that return a value rather than a status: a panic yields `fallback`.
pub(crate) fn guard_value<T>(fallback: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(fallback)
}

/// `slice_arg!(ptr, len, "name")`: a slice from a C array that may be NULL only when `len == 0`.
macro_rules! slice_arg {
    ($ptr:expr, $len:expr, $name:literal) => {{
        let (ptr, len) = ($ptr, $len);
        if len == 0 {
            &[][..]
        } else if ptr.is_null() {
            $crate::bail!(
                NullPointer,
                concat!($name, " is NULL with {} entries, expected an array"),
                len
            );
        } else {
            $crate::ensure!(
                (ptr as usize) % std::mem::align_of_val(unsafe { &*ptr }) == 0,
                InvalidArgument,
                concat!($name, " = {:p} is not aligned for its element type"),
                ptr
            );
            $crate::ensure!(
                len <= isize::MAX as usize / std::mem::size_of_val(unsafe { &*ptr }).max(1),
                Overflow,
                concat!($name, ": {} entries overflow the address space"),
                len
            );
            // SAFETY: the caller passes `len` readable entries at a non-NULL, aligned `ptr`.
            unsafe { std::slice::from_raw_parts(ptr, len) }
        }
    }};
}
pub(crate) use slice_arg;

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last() -> String {
        unsafe { CStr::from_ptr(last_error_ptr()) }
            .to_str()
            .unwrap()
            .to_owned()
    }

    #[test]
    fn statuses_and_messages() {
        assert_eq!(guard(|| Ok(())), 0);
        assert_eq!(last(), "");
        assert_eq!(
            guard(|| crate::bail!(OutOfBounds, "block_ids[3] = 9, expected < 4")),
            -4
        );
        assert_eq!(last(), "block_ids[3] = 9, expected < 4");
        assert_eq!(guard(|| Ok(())), 0);
        assert_eq!(last(), "");
    }

    #[test]
    fn panics_become_status() {
        let code = guard(|| panic!("boom {}", 7));
        assert_eq!(code, Status::Panic as i32);
        assert!(last().contains("boom 7"), "{}", last());
        assert_eq!(guard_value(5u32, || panic!("x")), 5);
    }
}
