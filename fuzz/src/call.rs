//! One fuzzed call: its tensor descriptors (decoded from the input, honest or hostile), the one
//! allocation that backs them with guard bytes between buffers, and the invariants every export
//! must keep (ABI.md §1–2):
//! - a refused call returns a documented status and a non-empty message naming an argument, and
//!   leaves every byte of the allocation as it was;
//! - a call with a descriptor that §2 makes invalid (bad device, dtype, ndim, negative shape or
//!   stride, NULL data for elements, an extent that overflows or leaves the address space, a
//!   misaligned base) is refused;
//! - an accepted call leaves an empty message, writes no byte outside the elements of its outputs,
//!   its outputs share no byte with its inputs, each other or themselves, its result does not
//!   depend on the thread count, and it equals the portable scalar reference (`Isa::Scalar`, the
//!   per-token recurrence) within the target's comparator.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ffi::{CStr, c_void};
use std::sync::OnceLock;

use half::{bf16, f16};
use ssmk::dtype::DType;
use ssmk::ffi::context::{ssmk_context, ssmk_context_create};
use ssmk::ffi::status::{SSMK_ERR_ALLOCATION, SSMK_ERR_PANIC, ssmk_last_error_message};
use ssmk::kernels::Path;
use ssmk::runtime::{Isa, with_every_call_parallel, with_isa};
use ssmk::tensor::{ssmk_device, ssmk_dtype, ssmk_tensor};

use crate::input::{Input, Rng};

/// Largest extent (bytes) and element count the harness backs with memory; a valid descriptor
/// beyond them gets NULL data, which the library must refuse (it has elements). Keeps every
/// accepted call small enough to run the reference on it.
pub const BYTES_CAP: usize = 256 << 10;
pub const NUMEL_CAP: usize = 1 << 14;
/// Bytes between buffers (and after the last), checked like every byte outside the outputs.
pub const GUARD: usize = 64;
/// Entries of every shape/stride array: more than `MAX_NDIM` (6), so a lying `ndim` up to 8 never
/// makes the library read past the harness's arrays.
const DIMS: usize = 8;

/// How an output is compared with the scalar reference.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Cmp {
    /// The same bits (any NaN equals any NaN).
    Exact,
    /// `|got - want| <= atol + rtol * (|want| + max |want| over the tensor)`; values beyond
    /// 1e30 or non-finite (overflow) are not compared with each other.
    Tol { atol: f64, rtol: f64 },
}

impl Cmp {
    /// One rounding step of `dtype` plus `f32_rtol` of f32 accumulation differences.
    pub fn rounding(dtype: DType, f32_rtol: f64) -> Cmp {
        let rtol = match dtype {
            DType::BF16 => 2.0 * 2f64.powi(-8),
            DType::F16 => 2.0 * 2f64.powi(-11),
            _ => 0.0,
        };
        Cmp::Tol {
            atol: 1e-5,
            rtol: rtol + f32_rtol,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Role {
    Input,
    /// Written by the call (outputs and state pools).
    Output(Cmp),
}

/// What a tensor's elements hold.
#[derive(Clone, Debug)]
pub enum Fill {
    /// Uniform in `[lo, hi]` (a wild call fills any bits, NaN and infinities included).
    Floats(f32, f32),
    /// These values in row-major element order (then small random ones).
    Ints(Vec<i64>),
}

/// Handle of a tensor of the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Id(usize);

/// What §2 says of a descriptor before the call looks at its meaning.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Validity {
    /// The call must be refused.
    Invalid,
    /// Zero elements: nothing is ever read or written.
    Empty,
    /// Valid: `numel` elements within `bytes` bytes from `lo` (an address).
    Span { lo: usize, bytes: usize },
}

struct Arg {
    name: &'static str,
    role: Role,
    fill: Fill,
    shape: Box<[i64; DIMS]>,
    strides: Box<[i64; DIMS]>,
    has_strides: bool,
    /// A hostile descriptor whose `shape` pointer is NULL.
    null_shape: bool,
    desc: ssmk_tensor,
    /// Data placement decisions, applied by `layout`.
    data: DataMode,
    /// Bytes the buffer is short of the descriptor's extent (a lying descriptor).
    short_by: usize,
    validity: Validity,
    /// Arena offsets of the elements in row-major index order (valid, backed tensors only).
    elems: Vec<usize>,
    elem_size: usize,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum DataMode {
    Own,
    /// Inside the buffer of an earlier tensor, this many 8-byte words in.
    Alias(usize, usize),
    Null,
}

/// The contexts a call may run on (created once; never destroyed).
fn contexts() -> &'static [usize; 2] {
    static CTX: OnceLock<[usize; 2]> = OnceLock::new();
    CTX.get_or_init(|| {
        [
            ssmk_context_create(1) as usize,
            ssmk_context_create(2) as usize,
        ]
    })
}

/// How the call under test runs; the reference always runs scalar, recurrent, on one thread.
#[derive(Clone, Copy, Debug)]
struct Exec {
    isa: Isa,
    path: Path,
    /// 0 = the process default (NULL), 1 = one thread, 2 = two threads.
    ctx: usize,
    parallel: bool,
}

impl Exec {
    fn ctx(&self) -> *const ssmk_context {
        match self.ctx {
            0 => std::ptr::null(),
            n => contexts()[n - 1] as *const ssmk_context,
        }
    }

    fn run<R>(&self, f: impl FnOnce(*const ssmk_context) -> R) -> R {
        let ctx = self.ctx();
        with_isa(self.isa, || {
            self.path.with(|| {
                if self.parallel {
                    with_every_call_parallel(|| f(ctx))
                } else {
                    f(ctx)
                }
            })
        })
    }
}

/// One call's tensors over one allocation.
pub struct Call {
    args: Vec<Arg>,
    rng: Rng,
    /// Descriptors may be hostile (else only layouts vary).
    pub hostile: bool,
    /// Floats may be any bits (NaN, infinities, huge): the reference comparison is skipped
    /// except for exact comparators.
    pub wild: bool,
    /// Outputs must not share bytes with inputs or other outputs (false: only with themselves).
    pub exclusive_outputs: bool,
    exec: Exec,
    check_threads: bool,
    arena: *mut u8,
    arena_len: usize,
}

impl Drop for Call {
    fn drop(&mut self) {
        if !self.arena.is_null() {
            unsafe { dealloc(self.arena, arena_layout(self.arena_len)) };
        }
    }
}

fn arena_layout(len: usize) -> Layout {
    Layout::from_size_align(len.max(1), 64).unwrap()
}

/// The accepted float dtypes, for targets choosing an activation dtype.
pub const FLOATS: [DType; 3] = [DType::F32, DType::BF16, DType::F16];
pub const INDEX: [DType; 2] = [DType::I32, DType::I64];
pub const MASKS: [DType; 4] = [DType::Bool, DType::U8, DType::I32, DType::I64];

impl Call {
    pub fn new(input: &mut Input) -> Call {
        let mode = input.byte();
        let supported = Isa::supported();
        let exec = Exec {
            isa: supported[input.below(supported.len())],
            path: input.pick(&[Path::Auto, Path::Recurrent, Path::Chunked]),
            ctx: input.below(3),
            parallel: input.chance(64),
        };
        Call {
            args: Vec::new(),
            rng: Rng::new(input.u64()),
            hostile: mode & 1 != 0,
            wild: mode & 6 == 6,
            exclusive_outputs: true,
            exec,
            check_threads: mode & 8 != 0,
            arena: std::ptr::null_mut(),
            arena_len: 0,
        }
    }

    /// A required tensor of intended `dtype` and `shape`; the input may vary its layout and, in a
    /// hostile call, any field of its descriptor.
    pub fn tensor(
        &mut self,
        input: &mut Input,
        name: &'static str,
        role: Role,
        dtype: DType,
        shape: &[usize],
        fill: Fill,
    ) -> Id {
        let hostile = self.hostile && input.chance(48);
        let (code, bits) = dtype.to_dlpack();
        let mut desc = ssmk_tensor {
            data: std::ptr::null_mut(),
            device: ssmk_device {
                device_type: if input.chance(24) { 3 } else { 1 },
                device_id: 0,
            },
            ndim: shape.len() as i32,
            dtype: ssmk_dtype {
                code,
                bits,
                lanes: 1,
            },
            shape: std::ptr::null(),
            strides: std::ptr::null(),
            byte_offset: 0,
        };
        let mut dims = Box::new([1i64; DIMS]);
        for (d, &n) in shape.iter().enumerate() {
            dims[d] = n as i64;
        }
        // Layout: row-major (NULL strides), or explicit strides in any dimension order with gaps,
        // sometimes a broadcast (zero) stride.
        let mut strides = Box::new([0i64; DIMS]);
        let mut has_strides = false;
        let layout = input.byte();
        if layout >= 128 {
            has_strides = true;
            let n = shape.len();
            let mut order: Vec<usize> = (0..n).collect();
            if layout >= 192 {
                for i in (1..n).rev() {
                    order.swap(i, input.below(i + 1));
                }
            }
            let mut acc = 1i64;
            for &d in order.iter().rev() {
                strides[d] = acc;
                let gap = if layout & 1 != 0 {
                    input.below(3) as i64
                } else {
                    0
                };
                acc = acc * dims[d].max(1) + gap;
            }
            if layout & 6 == 6 && n > 0 {
                strides[input.below(n)] = 0;
            }
        }
        let mut data = DataMode::Own;
        let mut null_shape = false;
        let mut short_by = 0;
        // Rare variations sit at high byte values: an exhausted input reads zeros.
        let extra = input.byte();
        if extra >= 248 && !self.args.is_empty() {
            let earlier = input.below(self.args.len());
            data = DataMode::Alias(earlier, input.below(64));
        } else if extra >= 240 {
            short_by = input.range(1, GUARD / 2);
        } else if extra >= 224 {
            desc.byte_offset = (input.range(1, 8) * dtype.size()) as u64;
        }
        if hostile {
            match input.below(12) {
                0 => {
                    let all = [
                        DType::F32,
                        DType::F16,
                        DType::BF16,
                        DType::I32,
                        DType::I64,
                        DType::Bool,
                        DType::U8,
                    ];
                    (desc.dtype.code, desc.dtype.bits) = input.pick(&all).to_dlpack();
                }
                1 => {
                    desc.dtype = ssmk_dtype {
                        code: input.byte(),
                        bits: input.byte(),
                        lanes: input.pick(&[1, 0, 2, u16::MAX]),
                    }
                }
                2 => desc.device.device_type = input.pick(&[0, 2, 4, -1, i32::MAX]),
                3 => {
                    desc.ndim = match input.below(4) {
                        0 => shape.len() as i32 - 1,
                        1 => shape.len() as i32 + 1,
                        2 => input.pick(&[-1, 7, 8, i32::MIN, i32::MAX]),
                        _ => input.below(7) as i32,
                    };
                    for d in shape.len()..DIMS {
                        dims[d] = input.below(3) as i64;
                    }
                }
                4 | 5 if !shape.is_empty() => {
                    let d = input.below(shape.len());
                    dims[d] = match input.below(3) {
                        0 => dims[d] + 1,
                        1 => dims[d] - 1,
                        _ => input.hostile_i64(),
                    };
                }
                6 if !shape.is_empty() => {
                    if !has_strides {
                        has_strides = true;
                        let mut acc = 1;
                        for d in (0..shape.len()).rev() {
                            strides[d] = acc;
                            acc *= dims[d].max(1);
                        }
                    }
                    strides[input.below(shape.len())] = input.hostile_i64();
                }
                7 => {
                    desc.byte_offset = match input.below(3) {
                        0 => desc.byte_offset + 1,
                        1 => u64::MAX - input.byte() as u64,
                        _ => 1 << 63,
                    }
                }
                8 => data = DataMode::Null,
                9 if !shape.is_empty() => null_shape = true,
                _ => {}
            }
        }
        self.args.push(Arg {
            name,
            role,
            fill,
            shape: dims,
            strides,
            has_strides,
            null_shape,
            desc,
            data,
            short_by,
            validity: Validity::Invalid,
            elems: Vec::new(),
            elem_size: dtype.size(),
        });
        Id(self.args.len() - 1)
    }

    /// An optional tensor: present with probability `present / 256` (`None` = a NULL descriptor).
    #[allow(clippy::too_many_arguments)]
    pub fn optional(
        &mut self,
        input: &mut Input,
        present: u8,
        name: &'static str,
        role: Role,
        dtype: DType,
        shape: &[usize],
        fill: Fill,
    ) -> Option<Id> {
        input
            .chance(present)
            .then(|| self.tensor(input, name, role, dtype, shape, fill))
    }

    /// A required tensor, or in a hostile call sometimes a NULL descriptor.
    pub fn required(
        &mut self,
        input: &mut Input,
        name: &'static str,
        role: Role,
        dtype: DType,
        shape: &[usize],
        fill: Fill,
    ) -> Option<Id> {
        if self.hostile && input.chance(8) {
            return None;
        }
        Some(self.tensor(input, name, role, dtype, shape, fill))
    }

    /// A float scalar argument: one of `usual`, or in a hostile call any value.
    pub fn scalar(&self, input: &mut Input, usual: &[f32]) -> f32 {
        if self.hostile && input.chance(48) {
            input.scalar(usual)
        } else {
            input.pick(usual)
        }
    }

    /// A dimension of `usual` size, or in a hostile call sometimes another small one.
    pub fn dim(&self, input: &mut Input, usual: usize) -> usize {
        if self.hostile && input.chance(16) {
            input.below(usual + 3)
        } else {
            usual
        }
    }

    /// Places every tensor in one allocation, fills it, and decides what §2 says of each
    /// descriptor. Call once, after the last `tensor`.
    pub fn layout(&mut self) {
        // Pass 1: each descriptor's extent from its own fields (addresses come later).
        let mut pos = GUARD;
        let mut places: Vec<Option<usize>> = Vec::with_capacity(self.args.len());
        let mut end = pos;
        for a in &mut self.args {
            a.desc.shape = if a.null_shape {
                std::ptr::null()
            } else {
                a.shape.as_ptr()
            };
            a.desc.strides = if a.has_strides {
                a.strides.as_ptr()
            } else {
                std::ptr::null()
            };
        }
        for a in &self.args {
            let span = extent(&a.desc);
            let place = match (span, a.data) {
                (Some((bytes, numel)), DataMode::Own | DataMode::Alias(..))
                    if bytes <= BYTES_CAP && numel <= NUMEL_CAP =>
                {
                    let at = match a.data {
                        DataMode::Alias(j, words) => places[j].map(|p| {
                            let room = extent(&self.args[j].desc).map_or(0, |(b, _)| b);
                            p + (words * 8) % room.max(8) / 8 * 8
                        }),
                        _ => None,
                    };
                    let at = at.unwrap_or_else(|| {
                        let at = pos;
                        pos = (pos + bytes.saturating_sub(a.short_by) + GUARD).next_multiple_of(64);
                        at
                    });
                    end = end.max(at + bytes + GUARD);
                    Some(at)
                }
                _ => None,
            };
            places.push(place);
        }
        let len = end.max(pos) + GUARD;
        self.arena_len = len;
        self.arena = unsafe { alloc_zeroed(arena_layout(len)) };
        assert!(!self.arena.is_null());
        let base = self.arena as usize;
        for i in 0..len {
            unsafe { *self.arena.add(i) = self.rng.next_u64() as u8 };
        }
        // Pass 2: addresses, validity, elements, values.
        for i in 0..self.args.len() {
            let a = &mut self.args[i];
            a.desc.data = match places[i] {
                Some(at) => (base + at).wrapping_sub(a.desc.byte_offset as usize) as *mut c_void,
                None if a.data == DataMode::Null || extent(&a.desc).is_some() => {
                    std::ptr::null_mut()
                }
                None => (base + GUARD) as *mut c_void,
            };
            a.validity = validity(&a.desc);
            if let Validity::Span { lo, .. } = a.validity {
                assert!(
                    places[i].is_some(),
                    "{}: a valid descriptor without memory",
                    a.name
                );
                a.elems = element_offsets(&a.desc, lo - base);
                a.elem_size = dtype_of(&a.desc).unwrap().size();
            }
        }
        for i in 0..self.args.len() {
            self.fill(i);
        }
        // Tensors sharing bytes read each other's values as their own dtype: any bits, as in a
        // wild call (and a refused one if an output is among them).
        let mut owner = vec![u16::MAX; self.arena_len];
        for (i, a) in self.args.iter().enumerate() {
            for &off in &a.elems {
                for o in &mut owner[off..off + a.elem_size] {
                    if *o != u16::MAX && *o != i as u16 {
                        self.wild = true;
                    }
                    *o = i as u16;
                }
            }
        }
    }

    fn fill(&mut self, i: usize) {
        let a = &self.args[i];
        let Some(dtype) = dtype_of(&a.desc) else {
            return;
        };
        let (wild, arena) = (self.wild, self.arena);
        for (n, &off) in a.elems.iter().enumerate() {
            let v = match &a.fill {
                Fill::Floats(lo, hi) if wild && dtype.is_float() => {
                    let bits = self.rng.next_u64();
                    match bits % 8 {
                        0 => [
                            f64::NAN,
                            f64::INFINITY,
                            -f64::INFINITY,
                            0.0,
                            -0.0,
                            1e30,
                            -1e30,
                            1e-40,
                        ][(bits >> 8) as usize % 8],
                        _ => f32::from_bits((bits >> 16) as u32) as f64,
                    }
                }
                Fill::Floats(lo, hi) => *lo as f64 + (*hi - *lo) as f64 * self.rng.unit(),
                Fill::Ints(values) => values
                    .get(n)
                    .copied()
                    .unwrap_or_else(|| (self.rng.next_u64() % 4) as i64)
                    as f64,
            };
            let exact_int = match &a.fill {
                Fill::Ints(values) => values.get(n).copied(),
                _ => None,
            };
            unsafe { write_value(arena.add(off), dtype, v, exact_int) };
        }
    }

    /// The descriptor to pass for `id` (`None`: NULL).
    pub fn desc(&self, id: Option<Id>) -> *mut ssmk_tensor {
        match id {
            Some(Id(i)) => &self.args[i].desc as *const ssmk_tensor as *mut ssmk_tensor,
            None => std::ptr::null_mut(),
        }
    }

    /// A buffer of `bytes` bytes inside the allocation, for exports that take raw pointers
    /// (batch memcpy): call `raw_region` before `layout`, then `raw` for its address.
    pub fn raw_region(&mut self, name: &'static str, bytes: usize) -> Id {
        let mut shape = Box::new([1i64; DIMS]);
        shape[0] = bytes as i64;
        let (code, bits) = DType::U8.to_dlpack();
        self.args.push(Arg {
            name,
            role: Role::Output(Cmp::Exact),
            fill: Fill::Floats(0.0, 255.0),
            shape,
            strides: Box::new([0; DIMS]),
            has_strides: false,
            null_shape: false,
            desc: ssmk_tensor {
                data: std::ptr::null_mut(),
                device: ssmk_device {
                    device_type: 1,
                    device_id: 0,
                },
                ndim: 1,
                dtype: ssmk_dtype {
                    code,
                    bits,
                    lanes: 1,
                },
                shape: std::ptr::null(),
                strides: std::ptr::null(),
                byte_offset: 0,
            },
            data: DataMode::Own,
            short_by: 0,
            validity: Validity::Invalid,
            elems: Vec::new(),
            elem_size: 1,
        });
        Id(self.args.len() - 1)
    }

    /// Start address of a tensor's first element (valid, backed tensors).
    pub fn raw(&self, id: Id) -> *mut u8 {
        match self.args[id.0].validity {
            Validity::Span { lo, .. } => lo as *mut u8,
            _ => panic!("{} has no memory", self.args[id.0].name),
        }
    }

    /// Address of the allocation (arena offsets are relative to it).
    pub fn arena_base(&self) -> usize {
        self.arena as usize
    }

    /// Whether §2 requires the call to be refused because of some descriptor.
    pub fn any_invalid(&self) -> bool {
        self.args.iter().any(|a| a.validity == Validity::Invalid)
    }

    /// Whether `id` is a valid descriptor (possibly empty) of its intended dtype.
    pub fn is_valid(&self, id: Id) -> bool {
        self.args[id.0].validity != Validity::Invalid
    }

    /// The descriptor's shape as the library sees it (valid descriptors only).
    pub fn shape(&self, id: Id) -> Vec<usize> {
        let a = &self.args[id.0];
        a.shape[..a.desc.ndim as usize]
            .iter()
            .map(|&n| n as usize)
            .collect()
    }

    pub fn dtype(&self, id: Id) -> Option<DType> {
        dtype_of(&self.args[id.0].desc)
    }

    /// Arena offsets of `id`'s elements, row-major.
    pub fn elems(&self, id: Id) -> &[usize] {
        &self.args[id.0].elems
    }

    pub fn elem_size(&self, id: Id) -> usize {
        self.args[id.0].elem_size
    }

    pub fn bytes(&self) -> Vec<u8> {
        unsafe { std::slice::from_raw_parts(self.arena, self.arena_len) }.to_vec()
    }

    fn restore(&self, bytes: &[u8]) {
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.arena, self.arena_len) };
    }

    /// Runs the call (`invoke` makes it with the given context) and checks every invariant of the
    /// module doc; `names` are the export's argument names as messages spell them. Returns the
    /// status and the allocation before and after, for target-specific checks.
    pub fn run(
        &mut self,
        names: &[&str],
        invoke: &dyn Fn(&Call, *const ssmk_context) -> i32,
    ) -> Outcome {
        if self.arena.is_null() {
            self.layout();
        }
        let before = self.bytes();
        let status = self.exec.run(|ctx| invoke(self, ctx));
        count(status);
        let message = unsafe { CStr::from_ptr(ssmk_last_error_message()) }
            .to_string_lossy()
            .into_owned();
        assert!(
            status != SSMK_ERR_PANIC,
            "panic caught at the boundary: {message}"
        );
        assert!(
            (SSMK_ERR_ALLOCATION..=0).contains(&status),
            "undocumented status {status}: {message}"
        );
        let after = self.bytes();
        if status != 0 {
            assert!(
                names_an_argument(&message, names),
                "status {status}: message {message:?} names no argument of {names:?}"
            );
            if let Some(i) = first_difference(&before, &after) {
                panic!(
                    "status {status} ({message}) but byte {i} changed: {}",
                    self.whose(i)
                );
            }
            return Outcome {
                status,
                before,
                after,
            };
        }
        assert!(message.is_empty(), "SSMK_OK with message {message:?}");
        if let Some(a) = self.args.iter().find(|a| a.validity == Validity::Invalid) {
            panic!(
                "accepted a call whose {} descriptor is invalid: {:?} shape {:?} strides {:?}",
                a.name,
                a.desc,
                &a.shape[..],
                a.has_strides.then_some(&a.strides[..])
            );
        }
        self.check_writes(&before, &after);
        if self.check_threads {
            self.restore(&before);
            let other = Exec {
                ctx: 1 + (self.exec.ctx != 2) as usize,
                parallel: true,
                ..self.exec
            };
            let again = other.run(|ctx| invoke(self, ctx));
            assert_eq!(again, 0, "accepted on {:?}, not on {other:?}", self.exec);
            let again = self.bytes();
            if let Some(i) = first_difference(&after, &again) {
                panic!(
                    "{:?} and {other:?} differ at byte {i}: {}",
                    self.exec,
                    self.whose(i)
                );
            }
        }
        self.restore(&before);
        let reference = Exec {
            isa: Isa::Scalar,
            path: Path::Recurrent,
            ctx: 1,
            parallel: false,
        };
        let code = reference.run(|ctx| invoke(self, ctx));
        assert_eq!(
            code, 0,
            "the scalar reference refused what {:?} accepted",
            self.exec
        );
        let want = self.bytes();
        self.restore(&after);
        self.compare(&want, &after);
        Outcome {
            status,
            before,
            after,
        }
    }

    /// No byte outside the outputs' elements changed; outputs share no byte with themselves and,
    /// when `exclusive_outputs`, none with each other or the inputs.
    fn check_writes(&self, before: &[u8], after: &[u8]) {
        const FREE: u16 = u16::MAX;
        let mut output_of = vec![FREE; self.arena_len];
        for (i, a) in self.args.iter().enumerate() {
            if !matches!(a.role, Role::Output(_)) {
                continue;
            }
            for &off in &a.elems {
                for b in off..off + a.elem_size {
                    let other = output_of[b];
                    assert!(
                        other == FREE || (other != i as u16 && !self.exclusive_outputs),
                        "accepted: output {} shares byte {b} with output {}",
                        a.name,
                        self.args[other as usize].name
                    );
                    output_of[b] = i as u16;
                }
            }
        }
        if self.exclusive_outputs {
            for a in self.args.iter().filter(|a| a.role == Role::Input) {
                for &off in &a.elems {
                    for b in off..off + a.elem_size {
                        assert!(
                            output_of[b] == FREE,
                            "accepted: output {} overlaps input {} at byte {b}",
                            self.args[output_of[b] as usize].name,
                            a.name
                        );
                    }
                }
            }
        }
        for (i, (x, y)) in before.iter().zip(after).enumerate() {
            assert!(
                x == y || output_of[i] != FREE,
                "accepted call wrote byte {i} outside its outputs: {}",
                self.whose(i)
            );
        }
    }

    /// Each output's elements against the reference's.
    fn compare(&self, want: &[u8], got: &[u8]) {
        for a in &self.args {
            let Role::Output(cmp) = a.role else { continue };
            let dtype = dtype_of(&a.desc).unwrap();
            let read =
                |bytes: &[u8], off: usize| unsafe { read_value(bytes.as_ptr().add(off), dtype) };
            let scale = a
                .elems
                .iter()
                .map(|&o| read(want, o))
                .filter(|v| v.is_finite())
                .fold(0.0f64, |m, v| m.max(v.abs()));
            for (n, &off) in a.elems.iter().enumerate() {
                let (w, g) = (read(want, off), read(got, off));
                let ok = match cmp {
                    Cmp::Exact => {
                        want[off..off + a.elem_size] == got[off..off + a.elem_size]
                            || (w.is_nan() && g.is_nan())
                    }
                    Cmp::Tol { .. } if self.wild => true,
                    // A computation that overflows (a state growing with a negative step, say)
                    // may end in inf, NaN or a value near f32's limit depending on the order
                    // of operations; none is more right.
                    Cmp::Tol { atol, rtol } => {
                        let overflowing = |v: f64| !v.is_finite() || v.abs() > 1e30;
                        (overflowing(w) && overflowing(g))
                            || (overflowing(w) || overflowing(g)) && scale > 1e30
                            || w == g
                            || (w.is_finite()
                                && g.is_finite()
                                && (g - w).abs() <= atol + rtol * (w.abs() + scale))
                    }
                };
                assert!(
                    ok,
                    "{}[{n}] (element {:?}) = {g}, scalar reference {w} ({cmp:?}, {:?})",
                    a.name,
                    unflatten(n, &a.shape[..a.desc.ndim as usize]),
                    self.exec
                );
            }
        }
    }

    /// Which tensor's buffer (or guard) holds arena byte `i`, for failure messages.
    fn whose(&self, i: usize) -> String {
        let base = self.arena as usize;
        let mut holders = Vec::new();
        for a in &self.args {
            if let Validity::Span { lo, bytes } = a.validity
                && (lo - base..lo - base + bytes).contains(&i)
            {
                let element = a.elems.iter().any(|&o| (o..o + a.elem_size).contains(&i));
                holders.push(format!(
                    "{} ({})",
                    a.name,
                    if element {
                        "an element"
                    } else {
                        "a gap between elements"
                    }
                ));
            }
        }
        if holders.is_empty() {
            "a guard byte".to_string()
        } else {
            holders.join(", ")
        }
    }
}

/// With `SSMK_FUZZ_STATS` set, prints how many calls ended in each status at every power of
/// two: a target whose calls are all refused tests validation only.
fn count(status: i32) {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    static COUNTS: [AtomicU64; 10] = [const { AtomicU64::new(0) }; 10];
    static ENABLED: OnceLock<bool> = OnceLock::new();
    if !*ENABLED.get_or_init(|| std::env::var_os("SSMK_FUZZ_STATS").is_some()) {
        return;
    }
    COUNTS[(-status).clamp(0, 9) as usize].fetch_add(1, Relaxed);
    let total: u64 = COUNTS.iter().map(|c| c.load(Relaxed)).sum();
    if total.is_power_of_two() && total >= 1024 {
        let by_status: Vec<String> = COUNTS
            .iter()
            .enumerate()
            .filter(|(_, c)| c.load(Relaxed) > 0)
            .map(|(s, c)| format!("{}: {}", -(s as i32), c.load(Relaxed)))
            .collect();
        eprintln!(
            "ssmk-fuzz calls {total}, by status {}",
            by_status.join(", ")
        );
    }
}

/// What a call returned and the allocation around it.
pub struct Outcome {
    pub status: i32,
    pub before: Vec<u8>,
    pub after: Vec<u8>,
}

fn dtype_of(d: &ssmk_tensor) -> Option<DType> {
    DType::from_dlpack(d.dtype.code, d.dtype.bits, d.dtype.lanes)
}

fn shape_strides(d: &ssmk_tensor) -> Option<(Vec<i64>, Vec<i64>)> {
    if !(0..=6).contains(&d.ndim) || (d.ndim > 0 && d.shape.is_null()) {
        return None;
    }
    let n = d.ndim as usize;
    let shape = unsafe { std::slice::from_raw_parts(d.shape, n) }.to_vec();
    let strides = if d.strides.is_null() {
        let mut s = vec![0i64; n];
        let mut acc = 1i64;
        for k in (0..n).rev() {
            s[k] = acc;
            acc = acc.saturating_mul(shape[k].max(1));
        }
        s
    } else {
        unsafe { std::slice::from_raw_parts(d.strides, n) }.to_vec()
    };
    Some((shape, strides))
}

/// Bytes from the first element to past the last and the element count, when the descriptor's
/// own fields are valid and it has elements (the address is not looked at).
fn extent(d: &ssmk_tensor) -> Option<(usize, usize)> {
    let dtype = dtype_of(d)?;
    if d.device.device_type != 1 && d.device.device_type != 3 {
        return None;
    }
    let (shape, strides) = shape_strides(d)?;
    if shape.iter().chain(&strides).any(|&v| v < 0) {
        return None;
    }
    let mut numel = 1usize;
    let mut last = 0usize;
    for (&n, &s) in shape.iter().zip(&strides) {
        numel = numel.checked_mul(n as usize)?;
        if n > 0 {
            last = last.checked_add((n as usize - 1).checked_mul(s as usize)?)?;
        }
    }
    if numel == 0 {
        return None;
    }
    Some((last.checked_add(1)?.checked_mul(dtype.size())?, numel))
}

/// ABI.md §2, independently of the library: what a descriptor at its final address is.
fn validity(d: &ssmk_tensor) -> Validity {
    let Some(dtype) = dtype_of(d) else {
        return Validity::Invalid;
    };
    if d.device.device_type != 1 && d.device.device_type != 3 {
        return Validity::Invalid;
    }
    let Some((shape, strides)) = shape_strides(d) else {
        return Validity::Invalid;
    };
    if shape.iter().chain(&strides).any(|&v| v < 0) {
        return Validity::Invalid;
    }
    if shape.contains(&0) {
        return Validity::Empty;
    }
    let Some((bytes, _)) = extent(d) else {
        return Validity::Invalid; // elements whose extent overflows
    };
    if d.data.is_null() {
        return Validity::Invalid;
    }
    let Some(lo) = (d.data as usize).checked_add(d.byte_offset as usize) else {
        return Validity::Invalid;
    };
    match lo.checked_add(bytes) {
        Some(hi) if hi <= isize::MAX as usize && lo % dtype.size() == 0 => {
            Validity::Span { lo, bytes }
        }
        _ => Validity::Invalid,
    }
}

/// Arena offsets of every element, row-major, for a valid descriptor whose first element is at
/// arena offset `first`.
fn element_offsets(d: &ssmk_tensor, first: usize) -> Vec<usize> {
    let (shape, strides) = shape_strides(d).unwrap();
    let size = dtype_of(d).unwrap().size();
    let numel: usize = shape.iter().map(|&n| n as usize).product();
    (0..numel)
        .map(|n| {
            let index = unflatten(n, &shape);
            first
                + index
                    .iter()
                    .zip(&strides)
                    .map(|(&i, &s)| i * s as usize)
                    .sum::<usize>()
                    * size
        })
        .collect()
}

fn unflatten(mut n: usize, shape: &[i64]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        let len = shape[d].max(1) as usize;
        index[d] = n % len;
        n /= len;
    }
    index
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// The message mentions one of `names` as a word (`x.shape[0]`, `cache_indices[2]`, ...).
fn names_an_argument(message: &str, names: &[&str]) -> bool {
    let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    names.iter().any(|name| {
        message.match_indices(name).any(|(i, _)| {
            !word(message[..i].chars().next_back())
                && !word(message[i + name.len()..].chars().next())
        })
    })
}

/// Stores `v` as `dtype` (integers exactly when `exact` is given).
unsafe fn write_value(p: *mut u8, dtype: DType, v: f64, exact: Option<i64>) {
    let int = exact.unwrap_or(if v.is_finite() { v as i64 } else { 0 });
    unsafe {
        match dtype {
            DType::F32 => p.cast::<f32>().write_unaligned(v as f32),
            DType::F16 => p.cast::<u16>().write_unaligned(f16::from_f64(v).to_bits()),
            DType::BF16 => p.cast::<u16>().write_unaligned(bf16::from_f64(v).to_bits()),
            DType::I32 => p.cast::<i32>().write_unaligned(int as i32),
            DType::I64 => p.cast::<i64>().write_unaligned(int),
            DType::Bool => p.write((int != 0) as u8),
            DType::U8 => p.write(int as u8),
        }
    }
}

/// Reads an element as f64.
///
/// # Safety
/// `p` points to a readable element of `dtype` (any alignment).
pub unsafe fn read_value(p: *const u8, dtype: DType) -> f64 {
    unsafe {
        match dtype {
            DType::F32 => p.cast::<f32>().read_unaligned() as f64,
            DType::F16 => f16::from_bits(p.cast::<u16>().read_unaligned()).to_f64(),
            DType::BF16 => bf16::from_bits(p.cast::<u16>().read_unaligned()).to_f64(),
            DType::I32 => p.cast::<i32>().read_unaligned() as f64,
            DType::I64 => p.cast::<i64>().read_unaligned() as f64,
            DType::Bool | DType::U8 => p.read() as f64,
        }
    }
}
