//! The two AMP kernels behind `GradScaler`, with PyTorch's exact semantics:
//! the fused non-finite check and unscale over a list of gradients
//! (`_amp_foreach_non_finite_check_and_unscale_`) and the scale update
//! (`_amp_update_scale_`).
//!
//! The unscale makes one pass over memory: every gradient is cut into chunks that run
//! in parallel ([`amp_tensor::parallel`]), and each chunk is multiplied and checked by a
//! branch-free, vectorisable loop (an OR of "not finite" bit tests, no per-element
//! branch).

use std::sync::RwLockWriteGuard;

use amp_tensor::half::{bf16, f16};
use amp_tensor::{cast_into, ensure, DType, Element, Error, Layout, Result, Storage, Tensor};

use crate::compute::ensure_same_device;

const UNSCALE_OP: &str = "_amp_foreach_non_finite_check_and_unscale_";
const UPDATE_OP: &str = "_amp_update_scale_";

/// Elements per parallel task of the unscale kernel.
const TASK: usize = 1 << 18;

/// Elements per widened block for 16-bit gradients.
const BLOCK: usize = 1024;

fn check_one_elem(op: &'static str, t: &Tensor, name: &str, dtype: DType) -> Result<()> {
    ensure!(
        t.elem_count() == 1,
        invalid(op, "{name} must be a 1-element tensor.")
    );
    if t.dtype() != dtype {
        let kind = if dtype == DType::I32 {
            "an int"
        } else {
            "a float"
        };
        return Err(Error::invalid(op, format!("{name} must be {kind} tensor.")));
    }
    Ok(())
}

/// Write the single element of a 1-element tensor of element type `T`.
fn write_one<T: Element>(t: &Tensor, v: T) -> Result<()> {
    let mut st = t.storage_mut();
    let s = T::slice_mut(st.cpu_mut()?).expect("dtype matches storage");
    s[t.layout().offset()] = v;
    Ok(())
}

/// PyTorch's `torch._amp_foreach_non_finite_check_and_unscale_`, in place.
///
/// For every element `v` of every tensor in `grads` (float16, bfloat16, float32 or
/// float64, mixed in one call, any strided layout): if `v` is infinite or NaN,
/// `found_inf` is set to `1.0` (it is never cleared); the element becomes `v` when
/// `inv_scale == 1.0` (left bitwise untouched, NaN payloads included), else
/// `v * inv_scale`: float16/bfloat16 are computed in float32 and rounded back, float32
/// in float32, float64 multiplies by the float32 `inv_scale` promoted to double.
///
/// `found_inf` and `inv_scale` must be 1-element float32 tensors on the gradients'
/// device. Every argument is validated before anything is written. Gradients sharing
/// a storage are handled as PyTorch would handle them one after the other.
///
/// # Errors
/// `found_inf`/`inv_scale` that are not 1-element float32 tensors (PyTorch's
/// `found_inf must be a float tensor.` ...), a non-floating gradient, a gradient on
/// another device, or one whose elements alias each other (a broadcast view).
pub fn non_finite_check_and_unscale_(
    grads: &[Tensor],
    found_inf: &Tensor,
    inv_scale: &Tensor,
) -> Result<()> {
    check_one_elem(UNSCALE_OP, inv_scale, "inv_scale", DType::F32)?;
    check_one_elem(UNSCALE_OP, found_inf, "found_inf", DType::F32)?;
    ensure_same_device(UNSCALE_OP, &[found_inf, inv_scale])?;
    for g in grads {
        ensure_same_device(UNSCALE_OP, &[found_inf, g])?;
        if !g.dtype().is_floating_point() {
            return Err(Error::UnsupportedDType {
                op: UNSCALE_OP,
                dtype: g.dtype(),
            });
        }
        if g.dims()
            .iter()
            .zip(g.strides())
            .any(|(&d, &s)| d > 1 && s == 0)
        {
            return Err(Error::invalid(
                UNSCALE_OP,
                "unsupported operation: more than one element of the written-to tensor refers to a single memory location. Please clone() the tensor before performing the operation.",
            ));
        }
    }
    crate::compute::on_device!(
        UNSCALE_OP,
        [found_inf, inv_scale],
        crate::cuda::route::non_finite_check_and_unscale_(grads, found_inf, inv_scale)
    );
    let inv = inv_scale.operand::<f32>()?;
    if unscale_all(grads, inv)? {
        write_one(found_inf, 1.0f32)?;
    }
    Ok(())
}

/// A locked storage buffer, as a raw pointer the tasks index into.
#[derive(Clone, Copy)]
struct RawBuf {
    ptr: *mut u8,
    len: usize,
}
// SAFETY: tasks touch disjoint element ranges of a buffer (or one task owns a
// buffer's overlapping views), while the write guards are held.
unsafe impl Send for RawBuf {}
// SAFETY: as above.
unsafe impl Sync for RawBuf {}

impl RawBuf {
    /// # Safety
    /// `T` must be the buffer's element type, and no other live slice may cover the
    /// elements this one is used to write.
    unsafe fn slice<'a, T>(self) -> &'a mut [T] {
        // SAFETY: `ptr`/`len` describe a live buffer of `T` (the caller's contract),
        // and no other live slice covers it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut T, self.len) }
    }
}

/// What one task unscales.
enum Piece {
    /// `len` contiguous elements from `start`.
    Range(usize, usize),
    /// Every element of a strided view.
    Strided(Layout),
}

struct Task {
    buf: usize,
    dtype: DType,
    /// Done in order (several entries only for views of one storage that overlap).
    pieces: Vec<Piece>,
}

fn piece_of(t: &Tensor) -> Piece {
    match t.layout().contiguous_range() {
        Some(r) => Piece::Range(r.start, r.len()),
        None => Piece::Strided(t.layout().clone()),
    }
}

/// The storage interval `[lo, hi)` a tensor's elements lie in.
fn interval(t: &Tensor) -> (usize, usize) {
    let l = t.layout();
    if l.elem_count() == 0 {
        return (l.offset(), l.offset());
    }
    let extent: usize = l
        .dims()
        .iter()
        .zip(l.strides())
        .map(|(&d, &s)| (d - 1) * s)
        .sum();
    (l.offset(), l.offset() + extent + 1)
}

fn unscale_all(grads: &[Tensor], inv: f32) -> Result<bool> {
    // One write lock per distinct storage, taken in a fixed (address) order.
    let mut order: Vec<usize> = (0..grads.len())
        .filter(|&i| grads[i].elem_count() > 0)
        .collect();
    order.sort_by_key(|&i| (grads[i].storage_id(), i));
    let mut guards: Vec<RwLockWriteGuard<'_, Storage>> = Vec::new();
    let mut bufs: Vec<RawBuf> = Vec::new();
    let mut tasks: Vec<Task> = Vec::new();
    let mut g = 0;
    while g < order.len() {
        let id = grads[order[g]].storage_id();
        let mut end = g;
        while end < order.len() && grads[order[end]].storage_id() == id {
            end += 1;
        }
        let members = &order[g..end];
        let first = &grads[members[0]];
        let mut guard = first.storage_mut();
        let dtype = first.dtype();
        let buf = amp_tensor::with_float_dtype!(dtype, T => {
            let s = T::slice_mut(guard.cpu_mut()?).expect("dtype matches storage");
            RawBuf { ptr: s.as_mut_ptr() as *mut u8, len: s.len() }
        }, _ => unreachable!("validated floating dtypes"));
        guards.push(guard);
        let b = bufs.len();
        bufs.push(buf);
        let mut spans: Vec<(usize, usize)> = members.iter().map(|&i| interval(&grads[i])).collect();
        spans.sort_unstable();
        let disjoint = spans.windows(2).all(|w| w[0].1 <= w[1].0);
        if disjoint {
            for &i in members {
                match piece_of(&grads[i]) {
                    Piece::Range(start, len) => {
                        let mut s = start;
                        while s < start + len {
                            let n = TASK.min(start + len - s);
                            tasks.push(Task {
                                buf: b,
                                dtype,
                                pieces: vec![Piece::Range(s, n)],
                            });
                            s += n;
                        }
                    }
                    p => tasks.push(Task {
                        buf: b,
                        dtype,
                        pieces: vec![p],
                    }),
                }
            }
        } else {
            // Overlapping views of one storage: one task, in list order.
            let mut ordered = members.to_vec();
            ordered.sort_unstable();
            let pieces = ordered.iter().map(|&i| piece_of(&grads[i])).collect();
            tasks.push(Task {
                buf: b,
                dtype,
                pieces,
            });
        }
        g = end;
    }
    let found = amp_tensor::parallel::map(tasks.len(), &|i| {
        let t = &tasks[i];
        let buf = bufs[t.buf];
        amp_tensor::with_float_dtype!(t.dtype, T => {
            // SAFETY: the buffer's dtype is `t.dtype`; tasks of one buffer cover
            // disjoint elements (checked above) and the guards outlive this loop.
            let s = unsafe { buf.slice::<T>() };
            t.pieces.iter().fold(false, |f, p| f | run_piece::<T>(s, p, inv))
        }, _ => unreachable!("validated floating dtypes"))
    })
    .into_iter()
    .any(|f| f);
    drop(guards);
    Ok(found)
}

fn run_piece<T: Unscale>(s: &mut [T], p: &Piece, inv: f32) -> bool {
    match p {
        Piece::Range(start, len) => T::unscale(&mut s[*start..*start + *len], inv),
        Piece::Strided(l) => {
            let mut found = false;
            l.for_each_run(|start, len, stride| {
                if stride == 1 {
                    found |= T::unscale(&mut s[start..start + len], inv);
                } else {
                    found |= unscale_strided(s, start, len, stride, inv);
                }
            });
            found
        }
    }
}

/// A strided run: gathered into a block, unscaled there, scattered back.
fn unscale_strided<T: Unscale>(
    s: &mut [T],
    start: usize,
    len: usize,
    stride: usize,
    inv: f32,
) -> bool {
    let mut found = false;
    let mut block = [T::default(); BLOCK];
    let mut done = 0;
    while done < len {
        let n = BLOCK.min(len - done);
        let b = &mut block[..n];
        for (j, v) in b.iter_mut().enumerate() {
            *v = s[start + (done + j) * stride];
        }
        found |= T::unscale(b, inv);
        if inv != 1.0 {
            for (j, v) in b.iter().enumerate() {
                s[start + (done + j) * stride] = *v;
            }
        }
        done += n;
    }
    found
}

/// The per-dtype contiguous kernel: unscale in place, return whether any element was
/// not finite.
trait Unscale: Element {
    fn unscale(s: &mut [Self], inv: f32) -> bool;
}

/// Generates a contiguous kernel for a type whose bit pattern tells finiteness:
/// `$check` is the plain loop, compiled once for the baseline and once with AVX2.
macro_rules! dispatch_avx2 {
    ($name:ident, $avx:ident, $body:ident, ($($arg:ident: $ty:ty),*)) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2")]
        unsafe fn $avx($($arg: $ty),*) -> bool {
            $body($($arg),*)
        }

        fn $name($($arg: $ty),*) -> bool {
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU supports AVX2 (checked just above).
                return unsafe { $avx($($arg),*) };
            }
            $body($($arg),*)
        }
    };
}

/// The unscale loop of one float type `$t` (bits `$bits`): OR together "exponent all
/// ones" over the buffer (integer compares, which vectorise, where `is_finite` would not)
/// and, unless `inv` is 1, multiply each value by `inv` in `$t`.
macro_rules! unscale_body {
    ($name:ident, $t:ty, $bits:ty, $abs:expr, $inf:expr) => {
        #[inline(always)]
        fn $name(s: &mut [$t], inv: f32) -> bool {
            let mut bad: $bits = 0;
            let inv = inv as $t;
            if inv == 1.0 {
                for v in s.iter() {
                    bad |= ((v.to_bits() & $abs) >= $inf) as $bits;
                }
            } else {
                for v in s.iter_mut() {
                    let x = *v;
                    bad |= ((x.to_bits() & $abs) >= $inf) as $bits;
                    *v = x * inv;
                }
            }
            bad != 0
        }
    };
}
unscale_body!(f32_body, f32, u32, 0x7FFF_FFFF, 0x7F80_0000);
unscale_body!(
    f64_body,
    f64,
    u64,
    0x7FFF_FFFF_FFFF_FFFF,
    0x7FF0_0000_0000_0000
);

/// Non-finite test on 16-bit patterns: exponent all ones (`inf_bits` is the
/// positive-infinity pattern).
#[inline(always)]
fn bits16_bad(bits: &[u16], inf_bits: u16) -> bool {
    let mut bad = 0u16;
    for &b in bits {
        bad |= ((b & 0x7FFF) >= inf_bits) as u16;
    }
    bad != 0
}

#[inline(always)]
fn scale_body(b: &mut [f32], inv: f32) -> bool {
    for v in b.iter_mut() {
        *v *= inv;
    }
    false
}

dispatch_avx2!(f32_kernel, f32_kernel_avx2, f32_body, (s: &mut [f32], inv: f32));
dispatch_avx2!(f64_kernel, f64_kernel_avx2, f64_body, (s: &mut [f64], inv: f32));
dispatch_avx2!(scale_f32, scale_f32_avx2, scale_body, (b: &mut [f32], inv: f32));

#[inline(always)]
fn bits_body(bits: &[u16], inf_bits: u16) -> bool {
    bits16_bad(bits, inf_bits)
}
dispatch_avx2!(bits16_kernel, bits16_kernel_avx2, bits_body, (bits: &[u16], inf_bits: u16));

impl Unscale for f32 {
    fn unscale(s: &mut [f32], inv: f32) -> bool {
        f32_kernel(s, inv)
    }
}

impl Unscale for f64 {
    fn unscale(s: &mut [f64], inv: f32) -> bool {
        f64_kernel(s, inv)
    }
}

/// 16-bit floats: finiteness from the bits, the product in f32 over widened blocks,
/// rounded back once (round to nearest even).
fn unscale16<T: Element>(
    s: &mut [T],
    inv: f32,
    bits: impl Fn(&[T]) -> &[u16],
    inf_bits: u16,
) -> bool {
    let found = bits16_kernel(bits(s), inf_bits);
    if inv != 1.0 {
        let mut buf = [0f32; BLOCK];
        for chunk in s.chunks_mut(BLOCK) {
            let b = &mut buf[..chunk.len()];
            cast_into(chunk, b);
            scale_f32(b, inv);
            cast_into(b, chunk);
        }
    }
    found
}

fn as_bits<T>(s: &[T]) -> &[u16] {
    debug_assert_eq!(std::mem::size_of::<T>(), 2);
    // SAFETY: f16 and bf16 are `repr(transparent)` wrappers of `u16`.
    unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u16, s.len()) }
}

impl Unscale for f16 {
    fn unscale(s: &mut [f16], inv: f32) -> bool {
        unscale16(s, inv, as_bits::<f16>, 0x7C00)
    }
}

impl Unscale for bf16 {
    fn unscale(s: &mut [bf16], inv: f32) -> bool {
        unscale16(s, inv, as_bits::<bf16>, 0x7F80)
    }
}

/// PyTorch's `torch._amp_update_scale_`, in place.
///
/// `scale` is a 1-element float32 tensor, `growth_tracker` a 1-element int32 tensor,
/// `found_inf` a 1-element float32 tensor. Exactly:
///
/// ```text
/// if found_inf != 0:  scale = f32(f64(scale) * backoff_factor); tracker = 0
/// else:
///     t = tracker + 1
///     if t == growth_interval:
///         s = f32(f64(scale) * growth_factor)
///         if isfinite(s): scale = s        # growth that would overflow is dropped
///         tracker = 0
///     else: tracker = t
/// ```
///
/// There is no floor: repeated backoff walks the scale down through subnormals to 0.
///
/// # Errors
/// Tensors of the wrong dtype or size (`current_scale must be a float tensor.`,
/// `growth_tracker must be an int tensor.`, ...) or on different devices.
pub fn update_scale_(
    scale: &Tensor,
    growth_tracker: &Tensor,
    found_inf: &Tensor,
    growth_factor: f64,
    backoff_factor: f64,
    growth_interval: i64,
) -> Result<()> {
    check_one_elem(UPDATE_OP, growth_tracker, "growth_tracker", DType::I32)?;
    check_one_elem(UPDATE_OP, scale, "current_scale", DType::F32)?;
    check_one_elem(UPDATE_OP, found_inf, "found_inf", DType::F32)?;
    ensure_same_device(UPDATE_OP, &[scale, growth_tracker, found_inf])?;
    crate::compute::on_device!(
        UPDATE_OP,
        [scale, growth_tracker, found_inf],
        crate::cuda::route::update_scale_(
            scale,
            growth_tracker,
            found_inf,
            (growth_factor, backoff_factor, growth_interval)
        )
    );
    let s = scale.operand::<f32>()?;
    let t = growth_tracker.operand::<i32>()?;
    let f = found_inf.operand::<f32>()?;
    let (new_s, new_t) = if f != 0.0 {
        ((s as f64 * backoff_factor) as f32, 0)
    } else {
        let t1 = t.wrapping_add(1);
        if t1 as i64 == growth_interval {
            let grown = (s as f64 * growth_factor) as f32;
            (if grown.is_finite() { grown } else { s }, 0)
        } else {
            (s, t1)
        }
    };
    write_one(scale, new_s)?;
    write_one(growth_tracker, new_t)?;
    Ok(())
}
