//! Shapes, dimension indices (with PyTorch's negative wrapping) and broadcasting.

use std::fmt;

use smallvec::SmallVec;

use crate::{Error, Result};

/// Sizes or strides of up to [`INLINE_DIMS`] dimensions held inline, more on the heap:
/// a tensor's shape and strides then cost no allocation of their own (two of the six
/// a small op's output made, measured on `mm` of 8×8).
pub(crate) type DimVec = SmallVec<[usize; INLINE_DIMS]>;

/// The rank up to which [`DimVec`] needs no allocation (attention's `[B, H, T, D]`).
pub(crate) const INLINE_DIMS: usize = 4;

/// The sizes of a tensor's dimensions. `[]` is a 0-dim tensor with one element.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(DimVec);

impl Shape {
    /// The dimension sizes.
    #[inline]
    pub fn dims(&self) -> &[usize] {
        &self.0
    }
    /// Number of dimensions.
    #[inline]
    pub fn rank(&self) -> usize {
        self.0.len()
    }
    /// Number of elements (1 for a 0-dim shape).
    ///
    /// # Panics
    /// When the count overflows `usize`: every constructor of a tensor checks its shape with
    /// [`Shape::storage_bytes`] first, so only a shape built outside a tensor can.
    #[inline]
    pub fn elem_count(&self) -> usize {
        self.checked_elem_count()
            .unwrap_or_else(|| panic!("{}", overflow(&self.0)))
    }

    /// Number of elements, or `None` when it overflows `usize`.
    #[inline]
    pub fn checked_elem_count(&self) -> Option<usize> {
        self.0.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
    }

    /// The bytes a buffer of this shape in `dtype` needs, checked: PyTorch's "Storage size
    /// calculation overflowed" error when the element count or the byte size does not fit
    /// (a buffer holds at most `isize::MAX` bytes).
    ///
    /// ```
    /// use amp_tensor::{DType, Shape};
    ///
    /// assert_eq!(Shape::from([2, 3]).storage_bytes(DType::F32).unwrap(), 24);
    /// let e = Shape::from([(1usize << 62) + 1, 4]).storage_bytes(DType::F32).unwrap_err();
    /// assert!(e.to_string().starts_with("Storage size calculation overflowed with sizes="));
    /// ```
    pub fn storage_bytes(&self, dtype: crate::DType) -> Result<usize> {
        self.checked_elem_count()
            .and_then(|n| n.checked_mul(dtype.size_in_bytes()))
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| overflow(&self.0))
    }
    /// Row-major (C-contiguous) strides of this shape, in elements.
    pub fn contiguous_strides(&self) -> Vec<usize> {
        self.contiguous_dim_vec().into_vec()
    }
    /// [`Shape::contiguous_strides`], inline.
    pub(crate) fn contiguous_dim_vec(&self) -> DimVec {
        let mut strides = DimVec::from_elem(0, self.0.len());
        let mut acc = 1;
        for (s, &d) in strides.iter_mut().zip(&self.0).rev() {
            *s = acc;
            acc *= d.max(1);
        }
        strides
    }
    /// Consume into the vector of sizes.
    pub fn into_dims(self) -> Vec<usize> {
        self.0.into_vec()
    }
    /// Size of dimension `dim` (negative counts from the end).
    pub fn dim(&self, dim: impl Dim) -> Result<usize> {
        Ok(self.0[dim.to_index(self.rank())?])
    }
}

/// PyTorch's error for a shape whose storage size overflows.
pub(crate) fn overflow(dims: &[usize]) -> Error {
    Error::refused(
        "storage",
        format!("Storage size calculation overflowed with sizes={dims:?}"),
    )
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}
impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl From<Vec<usize>> for Shape {
    fn from(v: Vec<usize>) -> Self {
        Shape(DimVec::from_slice(&v))
    }
}
impl From<&Vec<usize>> for Shape {
    fn from(v: &Vec<usize>) -> Self {
        Shape(DimVec::from_slice(v))
    }
}
impl From<&[usize]> for Shape {
    fn from(v: &[usize]) -> Self {
        Shape(DimVec::from_slice(v))
    }
}
impl<const N: usize> From<[usize; N]> for Shape {
    fn from(v: [usize; N]) -> Self {
        Shape(DimVec::from_slice(&v))
    }
}
impl<const N: usize> From<&[usize; N]> for Shape {
    fn from(v: &[usize; N]) -> Self {
        Shape(DimVec::from_slice(v))
    }
}
impl From<DimVec> for Shape {
    fn from(v: DimVec) -> Self {
        Shape(v)
    }
}
impl From<()> for Shape {
    fn from(_: ()) -> Self {
        Shape(DimVec::new())
    }
}
impl From<&Shape> for Shape {
    fn from(s: &Shape) -> Self {
        s.clone()
    }
}
impl From<usize> for Shape {
    fn from(n: usize) -> Self {
        Shape(DimVec::from_slice(&[n]))
    }
}

/// A dimension index: `usize` counts from the front, signed integers may be negative
/// and count from the end, as in PyTorch.
pub trait Dim: Copy {
    /// The index into a shape of rank `ndim`.
    fn to_index(self, ndim: usize) -> Result<usize>;
    /// The index of an insertion point (`unsqueeze`), valid in `0..=ndim`.
    fn to_insert_index(self, ndim: usize) -> Result<usize>;
}

/// Wrap a possibly negative dimension into `0..ndim` (a 0-dim tensor accepts -1 and 0).
pub fn wrap_dim(dim: i64, ndim: usize) -> Result<usize> {
    let n = ndim.max(1) as i64;
    if dim < -n || dim >= n {
        return Err(Error::DimOutOfRange { dim, ndim });
    }
    Ok(if dim < 0 { dim + n } else { dim } as usize)
}

impl Dim for usize {
    fn to_index(self, ndim: usize) -> Result<usize> {
        wrap_dim(self as i64, ndim)
    }
    fn to_insert_index(self, ndim: usize) -> Result<usize> {
        wrap_dim(self as i64, ndim + 1)
    }
}

macro_rules! signed_dim {
    ($($t:ty),*) => {$(
        impl Dim for $t {
            fn to_index(self, ndim: usize) -> Result<usize> {
                wrap_dim(self as i64, ndim)
            }
            fn to_insert_index(self, ndim: usize) -> Result<usize> {
                wrap_dim(self as i64, ndim + 1)
            }
        }
    )*};
}
signed_dim!(i32, i64, isize);

/// The broadcast of two shapes (numpy/PyTorch rules), or a shape-mismatch error.
pub fn broadcast_shapes(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(Error::ShapeMismatch {
                op,
                lhs: a.to_vec(),
                rhs: b.to_vec(),
                hint: Some(format!(
                    "The size of tensor a ({da}) must match the size of tensor b ({db}) at non-singleton dimension {i}"
                )),
            });
        };
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides_and_counts() {
        let s = Shape::from([2, 3, 4]);
        assert_eq!(s.contiguous_strides(), vec![12, 4, 1]);
        assert_eq!(s.elem_count(), 24);
        assert_eq!(Shape::from(()).elem_count(), 1);
        assert_eq!(s.dim(-1).unwrap(), 4);
        assert!(s.dim(3).is_err());
    }

    #[test]
    fn wrapping() {
        assert_eq!(wrap_dim(-1, 0).unwrap(), 0);
        assert_eq!(wrap_dim(-3, 3).unwrap(), 0);
        let e = wrap_dim(2, 2).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Dimension out of range (expected to be in range of [-2, 1], but got 2)"
        );
        assert_eq!((-1i64).to_insert_index(2).unwrap(), 2);
    }

    #[test]
    fn broadcasting() {
        assert_eq!(broadcast_shapes("add", &[3, 1], &[4]).unwrap(), vec![3, 4]);
        assert_eq!(broadcast_shapes("add", &[], &[2, 2]).unwrap(), vec![2, 2]);
        assert_eq!(
            broadcast_shapes("add", &[0, 1], &[1, 5]).unwrap(),
            vec![0, 5]
        );
        let e = broadcast_shapes("add", &[3], &[4]).unwrap_err();
        assert!(e
            .to_string()
            .contains("must match the size of tensor b (4)"));
    }
}
