//! The element trait tying Rust scalar types to [`DType`]s, and PyTorch's scalar casts.

use half::{bf16, f16};

use crate::{CpuStorage, DType};

/// How an element converts to others: the cast path PyTorch takes depends on the
/// source kind (a double is narrowed through float; an integer is converted directly).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Bool,
    Int,
    Float,
    Double,
}

/// A type whose all-zero bytes are a valid value (its zero, or `false`), so that a buffer
/// of it may come zeroed from the allocator ([`crate::pool::try_zeroed`]).
///
/// # Safety
/// An implementor must be valid when every byte of it is zero.
pub unsafe trait ZeroBits: Copy {}

// SAFETY: zero bytes are 0 / +0.0 / `false` for each of these primitive types.
unsafe impl ZeroBits for f16 {}
// SAFETY: as above.
unsafe impl ZeroBits for bf16 {}
// SAFETY: as above.
unsafe impl ZeroBits for f32 {}
// SAFETY: as above.
unsafe impl ZeroBits for f64 {}
// SAFETY: as above.
unsafe impl ZeroBits for bool {}
// SAFETY: as above.
unsafe impl ZeroBits for i8 {}
// SAFETY: as above.
unsafe impl ZeroBits for i16 {}
// SAFETY: as above.
unsafe impl ZeroBits for i32 {}
// SAFETY: as above.
unsafe impl ZeroBits for i64 {}
// SAFETY: as above.
unsafe impl ZeroBits for isize {}
// SAFETY: as above.
unsafe impl ZeroBits for u8 {}
// SAFETY: as above.
unsafe impl ZeroBits for u16 {}
// SAFETY: as above.
unsafe impl ZeroBits for u32 {}
// SAFETY: as above.
unsafe impl ZeroBits for u64 {}
// SAFETY: as above.
unsafe impl ZeroBits for usize {}

/// A Rust type that can be a tensor element.
///
/// Casts follow PyTorch's CPU semantics: round-to-nearest-even into 16-bit floats,
/// NaN and infinities kept, subnormals kept, float→int truncating toward zero (NaN and
/// out-of-range values give the minimum integer, as x86 does), int→int wrapping, any
/// nonzero (and NaN) → `true`. A float64 is narrowed to 16 bits through float32, as
/// PyTorch's `c10::Half(float)`/`c10::BFloat16(float)` constructors do.
pub trait Element:
    ZeroBits + Copy + Send + Sync + PartialEq + PartialOrd + std::fmt::Debug + Default + 'static
{
    const DTYPE: DType;
    const KIND: Kind;

    fn to_f32(self) -> f32;
    fn to_f64(self) -> f64;
    fn to_i64(self) -> i64;
    fn to_bool(self) -> bool;
    fn from_f32(v: f32) -> Self;
    fn from_f64(v: f64) -> Self;
    fn from_i64(v: i64) -> Self;
    fn from_bool(v: bool) -> Self;

    /// The storage's elements if it holds this type.
    fn slice(s: &CpuStorage) -> Option<&[Self]>;
    /// Mutable access to the storage's elements if it holds this type.
    fn slice_mut(s: &mut CpuStorage) -> Option<&mut [Self]>;
    /// Wrap a vector as storage.
    fn into_storage(v: Vec<Self>) -> CpuStorage;
    /// The storage's vector if it holds this type.
    fn vec_mut(s: &mut CpuStorage) -> Option<&mut Vec<Self>>;

    /// Convert to another element type with PyTorch's cast semantics.
    #[inline(always)]
    fn cast<U: Element>(self) -> U {
        match Self::KIND {
            Kind::Bool => U::from_bool(self.to_bool()),
            Kind::Int => U::from_i64(self.to_i64()),
            Kind::Float => U::from_f32(self.to_f32()),
            Kind::Double => U::from_f64(self.to_f64()),
        }
    }
}

macro_rules! storage_access {
    ($t:ty, $variant:ident) => {
        #[inline]
        fn slice(s: &CpuStorage) -> Option<&[Self]> {
            match s {
                CpuStorage::$variant(v) => Some(v),
                _ => None,
            }
        }
        #[inline]
        fn slice_mut(s: &mut CpuStorage) -> Option<&mut [Self]> {
            match s {
                CpuStorage::$variant(v) => Some(v),
                _ => None,
            }
        }
        #[inline]
        fn vec_mut(s: &mut CpuStorage) -> Option<&mut Vec<Self>> {
            match s {
                CpuStorage::$variant(v) => Some(v),
                _ => None,
            }
        }
        #[inline]
        fn into_storage(v: Vec<Self>) -> CpuStorage {
            CpuStorage::$variant(v)
        }
    };
}

/// Truncating float→int conversion as x86 `cvtt*` does it: NaN and out-of-range give MIN.
macro_rules! trunc_to_int {
    ($v:expr, $t:ty, $f:ty) => {{
        let v = $v;
        // MIN as float is exact (a power of two); the upper bound is exclusive.
        if v.is_nan() || v < (<$t>::MIN as $f) || v >= -(<$t>::MIN as $f) {
            <$t>::MIN
        } else {
            v as $t
        }
    }};
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    const KIND: Kind = Kind::Float;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        trunc_to_int!(self, i64, f32)
    }
    #[inline(always)]
    fn to_bool(self) -> bool {
        self != 0.0
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn from_bool(v: bool) -> Self {
        v as u8 as f32
    }
    storage_access!(f32, F32);
}

impl Element for f64 {
    const DTYPE: DType = DType::F64;
    const KIND: Kind = Kind::Double;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        trunc_to_int!(self, i64, f64)
    }
    #[inline(always)]
    fn to_bool(self) -> bool {
        self != 0.0
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v as f64
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v as f64
    }
    #[inline(always)]
    fn from_bool(v: bool) -> Self {
        v as u8 as f64
    }
    storage_access!(f64, F64);
}

macro_rules! half_element {
    ($t:ty, $variant:ident, $dtype:expr) => {
        impl Element for $t {
            const DTYPE: DType = $dtype;
            const KIND: Kind = Kind::Float;
            #[inline(always)]
            fn to_f32(self) -> f32 {
                <$t>::to_f32(self)
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                <$t>::to_f64(self)
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                <f32 as Element>::to_i64(<$t>::to_f32(self))
            }
            #[inline(always)]
            fn to_bool(self) -> bool {
                <$t>::to_f32(self) != 0.0
            }
            #[inline(always)]
            fn from_f32(v: f32) -> Self {
                <$t>::from_f32(v)
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                <$t>::from_f32(v as f32)
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                <$t>::from_f32(v as f32)
            }
            #[inline(always)]
            fn from_bool(v: bool) -> Self {
                if v {
                    <$t>::ONE
                } else {
                    <$t>::ZERO
                }
            }
            storage_access!($t, $variant);
        }
    };
}
half_element!(f16, F16, DType::F16);
half_element!(bf16, BF16, DType::BF16);

macro_rules! int_element {
    ($t:ty, $variant:ident, $dtype:expr) => {
        impl Element for $t {
            const DTYPE: DType = $dtype;
            const KIND: Kind = Kind::Int;
            #[inline(always)]
            fn to_f32(self) -> f32 {
                self as f32
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                self as i64
            }
            #[inline(always)]
            fn to_bool(self) -> bool {
                self != 0
            }
            #[inline(always)]
            fn from_f32(v: f32) -> Self {
                trunc_to_int!(v, $t, f32)
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                trunc_to_int!(v, $t, f64)
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn from_bool(v: bool) -> Self {
                v as $t
            }
            storage_access!($t, $variant);
        }
    };
}
int_element!(i64, I64, DType::I64);
int_element!(i32, I32, DType::I32);

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    const KIND: Kind = Kind::Bool;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as u8 as f32
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as u8 as f64
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self as i64
    }
    #[inline(always)]
    fn to_bool(self) -> bool {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v != 0.0
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v != 0
    }
    #[inline(always)]
    fn from_bool(v: bool) -> Self {
        v
    }
    storage_access!(bool, Bool);
}

/// The one `match` behind the dtype-binding macros ([`with_dtype!`](crate::with_dtype!),
/// [`with_float_dtype!`](crate::with_float_dtype!), and the kernels' `float_kernel!` and kin): each listed dtype is
/// an arm that binds the listed type aliases and evaluates `$body`; the other dtypes
/// evaluate `$other` (none left: the list must be exhaustive).
#[doc(hidden)]
#[macro_export]
macro_rules! bind_dtypes {
    ($dtype:expr, $body:expr, [$($D:ident => {$($A:ident = $ty:ty),+})+] $(, _ => $other:expr)?) => {{
        match $dtype {
            $($crate::DType::$D => {
                $(type $A = $ty;)+
                $body
            })+
            $(_ => $other,)?
        }
    }};
}

/// Run `$body` with the type alias `$T` bound to the Rust element type of `$dtype`.
///
/// This is how code that holds a runtime [`DType`] reaches a generic function once,
/// instead of matching on every dtype by hand.
#[macro_export]
macro_rules! with_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        $crate::bind_dtypes!($dtype, $body, [
            F16 => {$T = $crate::half::f16} BF16 => {$T = $crate::half::bf16}
            F32 => {$T = f32} F64 => {$T = f64}
            I64 => {$T = i64} I32 => {$T = i32} Bool => {$T = bool}
        ])
    };
}

/// Like [`with_dtype!`](crate::with_dtype!) for the floating dtypes only; `$other` is evaluated otherwise.
#[macro_export]
macro_rules! with_float_dtype {
    ($dtype:expr, $T:ident => $body:expr, _ => $other:expr) => {
        $crate::bind_dtypes!($dtype, $body, [
            F16 => {$T = $crate::half::f16} BF16 => {$T = $crate::half::bf16}
            F32 => {$T = f32} F64 => {$T = f64}
        ], _ => $other)
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_to_int_like_pytorch() {
        assert_eq!(<f32 as Element>::cast::<i64>(2.9), 2);
        assert_eq!(<f32 as Element>::cast::<i64>(-2.9), -2);
        assert_eq!(<f32 as Element>::cast::<i64>(f32::NAN), i64::MIN);
        assert_eq!(<f64 as Element>::cast::<i32>(3e9), i32::MIN);
        assert_eq!(<f64 as Element>::cast::<i32>(-2147483648.0), i32::MIN);
        assert_eq!(<f64 as Element>::cast::<i32>(2147483647.0), i32::MAX);
        assert_eq!(<i64 as Element>::cast::<i32>(1 << 33 | 5), 5);
        assert!(<f32 as Element>::cast::<bool>(f32::NAN));
        assert!(!<f32 as Element>::cast::<bool>(-0.0));
    }

    #[test]
    fn double_narrows_through_float() {
        // 1 + 2^-11 + 2^-40 rounds up to 1 + 2^-10 in one step, but through float32
        // it first becomes the tie 1 + 2^-11, which rounds to even (1.0).
        let v = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(<f64 as Element>::cast::<f16>(v), f16::from_f32(1.0));
    }

    #[test]
    fn specials_survive() {
        for v in [f32::INFINITY, f32::NEG_INFINITY] {
            assert_eq!(<f32 as Element>::cast::<bf16>(v).to_f32(), v);
            assert_eq!(<f32 as Element>::cast::<f16>(v).to_f32(), v);
        }
        assert!(<f32 as Element>::cast::<bf16>(f32::NAN).is_nan());
        // subnormal f16 kept
        let sub = f16::from_bits(1);
        assert_eq!(<f32 as Element>::cast::<f16>(sub.to_f32()), sub);
        // overflow to inf
        assert!(<f32 as Element>::cast::<f16>(70000.0).is_infinite());
    }
}
