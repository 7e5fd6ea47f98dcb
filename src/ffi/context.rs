//! Context lifetime: the caller decides how many threads ssmk may use.

use crate::runtime::Context;

use super::guard::guard_value;

/// Opaque execution context: a thread count and a private thread pool, built on first parallel
/// use. Create with `ssmk_context_create`, free with `ssmk_context_destroy`. A context may be used
/// by many host threads at once; destroying it while a call uses it is undefined behaviour.
#[allow(non_camel_case_types)]
pub struct ssmk_context {
    pub(crate) inner: Context,
}

impl ssmk_context {
    /// A context for Rust callers (the benchmark's `--simulate-threads`) that splits calls as
    /// `threads` threads would and records their tasks ([`Context::recording`]); free it with
    /// `ssmk_context_destroy`. Not part of the C ABI.
    pub fn recording(threads: usize) -> *mut ssmk_context {
        Box::into_raw(Box::new(ssmk_context {
            inner: Context::recording(threads),
        }))
    }

    /// The runtime context behind the handle.
    pub fn runtime(&self) -> &Context {
        &self.inner
    }
}

/// Creates a context that runs kernels on `num_threads` threads.
///
/// @param num_threads 1 runs every kernel on the calling thread and never starts a thread;
///        0 means the default: the environment variable `SSMK_NUM_THREADS`, else the number of
///        cores. Results are bitwise identical for every thread count. Calls too small to gain
///        from more threads (conv and ShortConv: under 131072 outputs, i.e. tokens x channels;
///        the delta rule and the scan without a chunked sequence, e.g. a decode: under 12 MiB of
///        state read and written) run on the calling thread whatever the count. The calling
///        thread is one of a call's `num_threads` workers (the pool holds `num_threads - 1`
///        threads): it wakes at most two pool threads, each of which wakes at most two more,
///        starts at once and never waits for one to wake. With the environment variable
///        `SSMK_POOL=openmp` at creation, a context whose process has an OpenMP runtime loaded
///        (libgomp's `GOMP_parallel` among its global symbols, e.g. once torch is imported)
///        spreads its calls over a team of that runtime's threads instead, so that ssmk and the
///        runtime share one set of threads; the team's end waits for every member.
/// @return a new context owned by the caller (free it with ssmk_context_destroy), or NULL if
///         memory could not be allocated.
#[unsafe(no_mangle)]
pub extern "C" fn ssmk_context_create(num_threads: u32) -> *mut ssmk_context {
    guard_value(std::ptr::null_mut(), || {
        Box::into_raw(Box::new(ssmk_context {
            inner: Context::new(num_threads),
        }))
    })
}

/// Frees a context and joins its threads. NULL is a no-op.
///
/// @param ctx a context from ssmk_context_create that no call is using, or NULL.
///
/// # Safety
/// `ctx` must come from `ssmk_context_create` and not have been destroyed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ssmk_context_destroy(ctx: *mut ssmk_context) {
    guard_value((), || {
        if !ctx.is_null() {
            // SAFETY: the caller hands back ownership of a context we created.
            drop(unsafe { Box::from_raw(ctx) });
        }
    })
}

/// Number of threads a context runs kernels on (NULL: the process default context).
///
/// @return the thread count, at least 1.
///
/// # Safety
/// `ctx` must be NULL or a live context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ssmk_context_num_threads(ctx: *const ssmk_context) -> u32 {
    guard_value(1, || {
        unsafe { resolve(ctx) }.threads().min(u32::MAX as usize) as u32
    })
}

/// The context a call runs on: the caller's, or the process default for NULL.
///
/// # Safety
/// `ctx` must be NULL or a live context.
pub(crate) unsafe fn resolve<'a>(ctx: *const ssmk_context) -> &'a Context {
    if ctx.is_null() {
        Context::process_default()
    } else {
        unsafe { &(*ctx).inner }
    }
}
