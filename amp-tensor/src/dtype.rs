//! Runtime element types, PyTorch's promotion table and `result_type`.

use std::fmt;
use std::str::FromStr;

use crate::Error;

/// The element type of a tensor. Names and `Display` follow PyTorch (`float16`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    Bool,
    I32,
    I64,
    F16,
    BF16,
    F32,
    F64,
}

/// The three promotion categories of PyTorch (complex is not supported).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Category {
    Bool,
    Integral,
    Floating,
}

impl DType {
    /// Every dtype, in promotion-lattice order.
    pub const ALL: [DType; 7] = [
        DType::Bool,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
    ];
    /// The floating dtypes.
    pub const FLOATS: [DType; 4] = [DType::F16, DType::BF16, DType::F32, DType::F64];

    /// PyTorch's name without the `torch.` prefix.
    pub const fn as_str(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
        }
    }

    /// PyTorch's `ScalarType` name, as its error messages print a dtype (`Float`, `Half`,
    /// `BFloat16`, `Double`, `Long`, `Int`, `Bool`).
    pub const fn scalar_type_name(self) -> &'static str {
        match self {
            DType::Bool => "Bool",
            DType::I32 => "Int",
            DType::I64 => "Long",
            DType::F16 => "Half",
            DType::BF16 => "BFloat16",
            DType::F32 => "Float",
            DType::F64 => "Double",
        }
    }

    /// The C++ element type PyTorch's messages print for a `caffe2::TypeMeta` (`float`,
    /// `double`, `c10::Half`, `c10::BFloat16`, `long int`, `int`, `bool`).
    pub const fn cpp_type_name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::I32 => "int",
            DType::I64 => "long int",
            DType::F16 => "c10::Half",
            DType::BF16 => "c10::BFloat16",
            DType::F32 => "float",
            DType::F64 => "double",
        }
    }

    /// The legacy tensor type name PyTorch's `expand` message prints (`torch.FloatTensor`).
    pub const fn tensor_type_name(self) -> &'static str {
        match self {
            DType::Bool => "torch.BoolTensor",
            DType::I32 => "torch.IntTensor",
            DType::I64 => "torch.LongTensor",
            DType::F16 => "torch.HalfTensor",
            DType::BF16 => "torch.BFloat16Tensor",
            DType::F32 => "torch.FloatTensor",
            DType::F64 => "torch.DoubleTensor",
        }
    }

    /// Bytes per element.
    pub const fn size_in_bytes(self) -> usize {
        match self {
            DType::Bool => 1,
            DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// `True` for float16, bfloat16, float32, float64.
    pub const fn is_floating_point(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// `True` for the 16-bit floating types, which kernels compute in float32.
    pub const fn is_reduced_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }

    /// The promotion category.
    pub const fn category(self) -> Category {
        match self {
            DType::Bool => Category::Bool,
            DType::I32 | DType::I64 => Category::Integral,
            _ => Category::Floating,
        }
    }

    /// The type kernels accumulate in: float32 for 16-bit floats, else the type itself.
    pub const fn accumulation_dtype(self) -> DType {
        match self {
            DType::F16 | DType::BF16 => DType::F32,
            d => d,
        }
    }
}

impl fmt::Display for DType {
    /// The name, padded as a string is (`{:>8}` aligns it).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl FromStr for DType {
    type Err = Error;
    /// Accepts PyTorch's names and aliases (`float`, `half`, `double`, `long`, `int`,
    /// optionally prefixed with `torch.`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.strip_prefix("torch.").unwrap_or(s);
        Ok(match s {
            "bool" => DType::Bool,
            "int32" | "int" => DType::I32,
            "int64" | "long" => DType::I64,
            "float16" | "half" => DType::F16,
            "bfloat16" => DType::BF16,
            "float32" | "float" => DType::F32,
            "float64" | "double" => DType::F64,
            _ => {
                return Err(Error::invalid(
                    "dtype",
                    format!("unknown dtype '{s}' (expected one of bool, int32, int64, float16, bfloat16, float32, float64)"),
                ))
            }
        })
    }
}

/// PyTorch's `torch.promote_types`: the smallest type both `a` and `b` convert to
/// without losing category. `float16` with `bfloat16` gives `float32`.
pub const fn promote_types(a: DType, b: DType) -> DType {
    use DType::*;
    match (a, b) {
        (x, y) if x as u8 == y as u8 => x,
        (Bool, x) | (x, Bool) => x,
        (F64, _) | (_, F64) => F64,
        (F32, _) | (_, F32) => F32,
        (F16, BF16) | (BF16, F16) => F32,
        (F16, _) | (_, F16) => F16,
        (BF16, _) | (_, BF16) => BF16,
        (I64, _) | (_, I64) => I64,
        _ => I32,
    }
}

/// A Python-style scalar operand for [`result_type`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    Bool(bool),
    Int(i64),
    Float(f64),
}

impl Scalar {
    /// The value as f64 (bools are 0 / 1).
    pub fn to_f64(self) -> f64 {
        match self {
            Scalar::Bool(b) => b as u8 as f64,
            Scalar::Int(i) => i as f64,
            Scalar::Float(f) => f,
        }
    }
    /// The dtype a wrapped scalar of this kind has: float32 (the default dtype) for
    /// floats, int64 for ints, bool for bools.
    pub const fn default_dtype(self) -> DType {
        match self {
            Scalar::Bool(_) => DType::Bool,
            Scalar::Int(_) => DType::I64,
            Scalar::Float(_) => DType::F32,
        }
    }
}

/// `From` for each Rust scalar type, into the variant of its kind (exact: `f32`,
/// `i32` widen losslessly).
macro_rules! scalar_from {
    ($($t:ty => $variant:ident($wide:ty)),* $(,)?) => {$(
        impl From<$t> for Scalar {
            fn from(v: $t) -> Self {
                Scalar::$variant(<$wide>::from(v))
            }
        }
    )*};
}
scalar_from!(f64 => Float(f64), f32 => Float(f64), i64 => Int(i64), i32 => Int(i64), bool => Bool(bool));

/// One operand of [`result_type`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Operand {
    /// A tensor of this dtype with this many dimensions (0 = a 0-dim tensor).
    Tensor { dtype: DType, ndim: usize },
    /// A Python scalar (a "wrapped number").
    Scalar(Scalar),
}

/// PyTorch's `torch.result_type` over tensors and scalars: dimensioned tensors outrank
/// 0-dim tensors, which outrank scalars, except that a lower tier of a higher category
/// (a float scalar with an integer tensor) lifts the result to that category.
pub fn result_type(operands: &[Operand]) -> Option<DType> {
    let (mut dim, mut zero, mut wrapped): (Option<DType>, Option<DType>, Option<DType>) =
        (None, None, None);
    let merge = |slot: &mut Option<DType>, d: DType| {
        *slot = Some(match *slot {
            None => d,
            Some(c) => promote_types(c, d),
        })
    };
    for op in operands {
        match *op {
            Operand::Tensor { dtype, ndim } if ndim > 0 => merge(&mut dim, dtype),
            Operand::Tensor { dtype, .. } => merge(&mut zero, dtype),
            Operand::Scalar(s) => merge(&mut wrapped, s.default_dtype()),
        }
    }
    combine_categories(dim, combine_categories(zero, wrapped))
}

fn combine_categories(higher: Option<DType>, lower: Option<DType>) -> Option<DType> {
    match (higher, lower) {
        (None, l) => l,
        (h, None) => h,
        (Some(h), Some(l)) => {
            if h.is_floating_point() {
                Some(h)
            } else if h == DType::Bool || l.is_floating_point() {
                Some(promote_types(h, l))
            } else {
                Some(h)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DType::*;

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(d.to_string().parse::<DType>().unwrap(), d);
        }
        assert_eq!("torch.half".parse::<DType>().unwrap(), F16);
        assert!("complex64".parse::<DType>().is_err());
    }

    #[test]
    fn promotion_table() {
        assert_eq!(promote_types(F16, BF16), F32);
        assert_eq!(promote_types(BF16, F32), F32);
        assert_eq!(promote_types(I64, F16), F16);
        assert_eq!(promote_types(Bool, I32), I32);
        assert_eq!(promote_types(I32, I64), I64);
        assert_eq!(promote_types(F32, F64), F64);
        for a in DType::ALL {
            for b in DType::ALL {
                assert_eq!(promote_types(a, b), promote_types(b, a));
            }
        }
    }

    fn t(dtype: DType, ndim: usize) -> Operand {
        Operand::Tensor { dtype, ndim }
    }

    #[test]
    fn result_type_tiers() {
        // a 0-dim f32 loss times a 1-d bf16 tensor stays bf16
        assert_eq!(result_type(&[t(BF16, 1), t(F32, 0)]), Some(BF16));
        // two 0-dim tensors promote normally
        assert_eq!(result_type(&[t(BF16, 0), t(F32, 0)]), Some(F32));
        // float scalar lifts an int tensor to the default dtype
        assert_eq!(
            result_type(&[t(I64, 2), Operand::Scalar(2.5.into())]),
            Some(F32)
        );
        // but not a half tensor
        assert_eq!(
            result_type(&[t(F16, 2), Operand::Scalar(2.5.into())]),
            Some(F16)
        );
        // int scalar keeps an int32 tensor
        assert_eq!(
            result_type(&[t(I32, 1), Operand::Scalar(3i64.into())]),
            Some(I32)
        );
        // 0-dim f64 with dimensioned int gives f64
        assert_eq!(result_type(&[t(I32, 1), t(F64, 0)]), Some(F64));
        // bool tensor with int scalar
        assert_eq!(
            result_type(&[t(Bool, 1), Operand::Scalar(3i64.into())]),
            Some(I64)
        );
        assert_eq!(result_type(&[]), None);
    }
}
