//! Portable zeroing: `write_bytes`, which LLVM lowers to memset.

/// # Safety
/// `[dst, dst+len)` must be writable.
pub unsafe fn zero(dst: *mut u8, len: usize) {
    unsafe { std::ptr::write_bytes(dst, 0, len) }
}
