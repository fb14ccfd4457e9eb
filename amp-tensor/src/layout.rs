//! Shape + strides + offset: how a tensor's elements sit in its storage.

use crate::shape::{broadcast_shapes, Dim, DimVec};
use crate::{ensure, Error, Result, Shape};

/// A strided view into a flat storage. Strides are in elements and never negative.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    shape: Shape,
    strides: DimVec,
    offset: usize,
}

impl Layout {
    /// A row-major layout starting at `offset`.
    pub fn contiguous_with_offset(shape: impl Into<Shape>, offset: usize) -> Self {
        let shape = shape.into();
        let strides = shape.contiguous_dim_vec();
        Layout {
            shape,
            strides,
            offset,
        }
    }
    /// A row-major layout starting at 0.
    pub fn contiguous(shape: impl Into<Shape>) -> Self {
        Self::contiguous_with_offset(shape, 0)
    }
    /// A layout from explicit parts (caller guarantees they fit the storage).
    pub fn new(shape: impl Into<Shape>, strides: Vec<usize>, offset: usize) -> Self {
        Self::with_strides(shape, DimVec::from_slice(&strides), offset)
    }
    /// [`Layout::new`] from inline strides.
    fn with_strides(shape: impl Into<Shape>, strides: DimVec, offset: usize) -> Self {
        let shape = shape.into();
        debug_assert_eq!(shape.rank(), strides.len());
        Layout {
            shape,
            strides,
            offset,
        }
    }
    #[inline]
    pub fn shape(&self) -> &Shape {
        &self.shape
    }
    #[inline]
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }
    #[inline]
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }
    #[inline]
    pub fn offset(&self) -> usize {
        self.offset
    }
    #[inline]
    pub fn rank(&self) -> usize {
        self.shape.rank()
    }
    #[inline]
    pub fn elem_count(&self) -> usize {
        self.shape.elem_count()
    }

    /// Row-major contiguous (size-1 dimensions may have any stride; a tensor with no
    /// element is contiguous whatever its strides, as in PyTorch).
    pub fn is_contiguous(&self) -> bool {
        if self.elem_count() == 0 {
            return true;
        }
        let mut acc = 1;
        for (&d, &s) in self.dims().iter().zip(&self.strides).rev() {
            if d != 1 && s != acc {
                return false;
            }
            acc *= d;
        }
        true
    }

    /// If contiguous, the storage range its elements occupy.
    pub fn contiguous_range(&self) -> Option<std::ops::Range<usize>> {
        self.is_contiguous()
            .then(|| self.offset..self.offset + self.elem_count())
    }

    /// Swap two dimensions.
    pub fn transpose(&self, d0: impl Dim, d1: impl Dim) -> Result<Layout> {
        let (a, b) = (d0.to_index(self.rank())?, d1.to_index(self.rank())?);
        let mut l = self.clone();
        if self.rank() > 0 {
            let mut dims = DimVec::from_slice(l.dims());
            dims.swap(a, b);
            l.strides.swap(a, b);
            l.shape = dims.into();
        }
        Ok(l)
    }

    /// Reorder dimensions: output dim `i` is input dim `perm[i]`.
    pub fn permute<D: Dim>(&self, perm: &[D]) -> Result<Layout> {
        let n = self.rank();
        ensure!(
            perm.len() == n,
            invalid(
                "permute",
                "number of dims don't match in permute: got {} for a tensor of {n} dims",
                perm.len()
            )
        );
        let mut seen = smallvec::SmallVec::<[bool; 8]>::from_elem(false, n);
        let mut dims = DimVec::with_capacity(n);
        let mut strides = DimVec::with_capacity(n);
        for &p in perm {
            let p = p.to_index(n)?;
            ensure!(
                !(std::mem::replace(&mut seen[p], true)),
                invalid("permute", "repeated dim in permute")
            );
            dims.push(self.dims()[p]);
            strides.push(self.strides[p]);
        }
        Ok(Layout::with_strides(dims, strides, self.offset))
    }

    /// Keep `len` entries of `dim` starting at `start`.
    pub fn narrow(&self, dim: impl Dim, start: usize, len: usize) -> Result<Layout> {
        let d = dim.to_index(self.rank())?;
        let size = self.dims()[d];
        ensure!(
            start + len <= size,
            invalid(
                "narrow",
                "start ({start}) + length ({len}) exceeds dimension size ({size})."
            )
        );
        let mut dims = DimVec::from_slice(self.dims());
        dims[d] = len;
        let offset = if len == 0 {
            self.offset
        } else {
            self.offset + start * self.strides[d]
        };
        Ok(Layout::with_strides(dims, self.strides.clone(), offset))
    }

    /// Every `step`-th entry of `dim` in `start..end` (Python's `x[start:end:step]`).
    pub fn slice(&self, dim: impl Dim, start: usize, end: usize, step: usize) -> Result<Layout> {
        ensure!(step != 0, invalid("slice", "slice step must be positive"));
        let d = dim.to_index(self.rank())?;
        let size = self.dims()[d];
        let end = end.min(size);
        let start = start.min(end);
        let len = (end - start).div_ceil(step);
        let mut dims = DimVec::from_slice(self.dims());
        let mut strides = self.strides.clone();
        dims[d] = len;
        let offset = if len == 0 {
            self.offset
        } else {
            self.offset + start * strides[d]
        };
        strides[d] *= step;
        Ok(Layout::with_strides(dims, strides, offset))
    }

    /// Pick entry `index` of `dim` and drop that dimension (negative counts from the end).
    pub fn select(&self, dim: impl Dim, index: i64) -> Result<Layout> {
        let d = dim.to_index(self.rank())?;
        ensure!(
            self.rank() != 0,
            invalid("select", "select() cannot be applied to a 0-dim tensor.")
        );
        let size = self.dims()[d];
        let i = if index < 0 {
            index + size as i64
        } else {
            index
        };
        if i < 0 || i >= size as i64 {
            return Err(Error::IndexOutOfRange {
                op: "select",
                index,
                dim: d,
                size,
            });
        }
        let mut dims = DimVec::from_slice(self.dims());
        let mut strides = self.strides.clone();
        dims.remove(d);
        let st = strides.remove(d);
        Ok(Layout::with_strides(
            dims,
            strides,
            self.offset + i as usize * st,
        ))
    }

    /// Insert a size-1 dimension at `dim`.
    pub fn unsqueeze(&self, dim: impl Dim) -> Result<Layout> {
        let d = dim.to_insert_index(self.rank())?;
        let mut dims = DimVec::from_slice(self.dims());
        let mut strides = self.strides.clone();
        let st = if d < self.rank() {
            dims[d] * strides[d]
        } else {
            1
        };
        dims.insert(d, 1);
        strides.insert(d, st.max(1));
        Ok(Layout::with_strides(dims, strides, self.offset))
    }

    /// Remove dimension `dim` if its size is 1 (otherwise unchanged, as PyTorch).
    pub fn squeeze(&self, dim: impl Dim) -> Result<Layout> {
        let d = dim.to_index(self.rank())?;
        if self.rank() == 0 || self.dims()[d] != 1 {
            return Ok(self.clone());
        }
        let mut dims = DimVec::from_slice(self.dims());
        let mut strides = self.strides.clone();
        dims.remove(d);
        strides.remove(d);
        Ok(Layout::with_strides(dims, strides, self.offset))
    }

    /// Remove every size-1 dimension.
    pub fn squeeze_all(&self) -> Layout {
        let (dims, strides): (DimVec, DimVec) = self
            .dims()
            .iter()
            .zip(&self.strides)
            .filter(|(&d, _)| d != 1)
            .map(|(&d, &s)| (d, s))
            .unzip();
        Layout::with_strides(dims, strides, self.offset)
    }

    /// Broadcast to `shape` with zero strides (`expand`); `shape` must be reachable.
    pub fn broadcast_as(&self, shape: &[usize]) -> Result<Layout> {
        let n = shape.len();
        ensure!(n >= self.rank(), invalid("expand", "the number of sizes provided ({n}) must be greater or equal to the number of dimensions in the tensor ({})", self.rank()));
        let lead = n - self.rank();
        let mut strides = DimVec::from_elem(0, n);
        for i in 0..n {
            if i < lead {
                continue;
            }
            let (d, s) = (self.dims()[i - lead], self.strides[i - lead]);
            if d == shape[i] {
                strides[i] = s;
            } else if d != 1 {
                return Err(Error::ShapeMismatch {
                    op: "expand",
                    lhs: self.dims().to_vec(),
                    rhs: shape.to_vec(),
                    hint: Some(format!(
                        "The expanded size of the tensor ({}) must match the existing size ({d}) at non-singleton dimension {i}.  Target sizes: {shape:?}.  Tensor sizes: {:?}",
                        shape[i],
                        self.dims()
                    )),
                });
            }
        }
        Ok(Layout::with_strides(shape, strides, self.offset))
    }

    /// Broadcast two layouts against each other.
    pub fn broadcast_pair(op: &'static str, a: &Layout, b: &Layout) -> Result<(Layout, Layout)> {
        let shape = broadcast_shapes(op, a.dims(), b.dims())?;
        Ok((a.broadcast_as(&shape)?, b.broadcast_as(&shape)?))
    }

    /// The strides of a view with shape `new` over these elements, if one exists
    /// without copying (PyTorch's `computeStride`).
    pub fn view_strides(&self, new: &[usize]) -> Option<Vec<usize>> {
        self.view_dim_vec(new).map(DimVec::into_vec)
    }

    /// The view of these elements with shape `new` ([`Layout::view_strides`]), if one
    /// exists without copying.
    pub(crate) fn view(&self, new: &[usize]) -> Option<Layout> {
        let strides = self.view_dim_vec(new)?;
        Some(Layout::with_strides(new, strides, self.offset))
    }

    /// [`Layout::view_strides`], inline.
    fn view_dim_vec(&self, new: &[usize]) -> Option<DimVec> {
        let old_dims = self.dims();
        let old_strides = &self.strides;
        let numel = self.elem_count();
        if old_dims.is_empty() {
            return Some(DimVec::from_elem(1, new.len()));
        }
        if numel == 0 {
            return Some(Shape::from(new).contiguous_dim_vec());
        }
        let mut new_strides = DimVec::from_elem(0, new.len());
        let mut view_d = new.len() as isize - 1;
        let mut chunk_base_stride = *old_strides.last().unwrap();
        let mut tensor_numel = 1usize;
        let mut view_numel = 1usize;
        for tensor_d in (0..old_dims.len()).rev() {
            tensor_numel *= old_dims[tensor_d];
            if tensor_d == 0
                || (old_dims[tensor_d - 1] != 1
                    && old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride)
            {
                while view_d >= 0 && (view_numel < tensor_numel || new[view_d as usize] == 1) {
                    new_strides[view_d as usize] = view_numel * chunk_base_stride;
                    view_numel *= new[view_d as usize];
                    view_d -= 1;
                }
                if view_numel != tensor_numel {
                    return None;
                }
                if tensor_d > 0 {
                    chunk_base_stride = old_strides[tensor_d - 1];
                    tensor_numel = 1;
                    view_numel = 1;
                }
            }
        }
        if view_d != -1 {
            return None;
        }
        Some(new_strides)
    }

    /// Iterate over the storage offsets of every element, in row-major order.
    pub fn offsets(&self) -> StridedOffsets<'_> {
        StridedOffsets::new(self)
    }

    /// Visit the elements as runs along the innermost dimension, after merging the
    /// dimensions that walk memory as one (size-1 dims dropped; a dim folded into the next
    /// when its stride is the next one's stride times size, as in a contiguous block or a
    /// run of broadcast dims): `f(start, len, stride)` is called once per run, in
    /// row-major order. Kernels use it to keep inner loops tight.
    pub fn for_each_run(&self, f: impl FnMut(usize, usize, usize)) {
        if let Some(runs) = self.elem_count().checked_div(self.run_len()) {
            self.for_each_run_in(0..runs, f);
        }
    }

    /// The length of every run [`Layout::for_each_run`] visits: the element count when
    /// contiguous, 0 when there is no element.
    pub fn run_len(&self) -> usize {
        let n = self.elem_count();
        if n == 0 || self.is_contiguous() {
            return n;
        }
        let (dims, _) = self.coalesced_inline();
        dims[dims.len() - 1]
    }

    /// [`Layout::for_each_run`] over the runs `runs` only (numbered from 0 in row-major
    /// order, each [`Layout::run_len`] long): a gather split into parts starts each part
    /// at its own run.
    pub fn for_each_run_in(
        &self,
        runs: std::ops::Range<usize>,
        mut f: impl FnMut(usize, usize, usize),
    ) {
        let n = self.elem_count();
        if n == 0 || runs.is_empty() {
            return;
        }
        if let Some(r) = self.contiguous_range() {
            return f(r.start, n, 1);
        }
        let (dims, strides) = self.coalesced_inline();
        let rank = dims.len();
        let (inner, inner_stride) = (dims[rank - 1], strides[rank - 1]);
        let outer = &dims[..rank - 1];
        let outer_strides = &strides[..rank - 1];
        // The index over the outer dims, and the offset, of run `runs.start`.
        let mut idx = DimVec::from_elem(0, outer.len());
        let mut off = self.offset;
        let mut rest = runs.start;
        for d in (0..outer.len()).rev() {
            idx[d] = rest % outer[d];
            rest /= outer[d];
            off += idx[d] * outer_strides[d];
        }
        for _ in runs {
            f(off, inner, inner_stride);
            for d in (0..outer.len()).rev() {
                idx[d] += 1;
                off += outer_strides[d];
                if idx[d] < outer[d] {
                    break;
                }
                off -= outer_strides[d] * outer[d];
                idx[d] = 0;
            }
        }
    }
}

impl Layout {
    /// Dims and strides with size-1 dims dropped and each dim merged into the next one
    /// when `stride[d] == stride[d + 1] * dim[d + 1]` (they then address memory as one
    /// dim); at least one dim. The same elements in the same order (the CUDA kernels'
    /// strided arguments are built from it).
    pub fn coalesced(&self) -> (Vec<usize>, Vec<usize>) {
        let (dims, strides) = self.coalesced_inline();
        (dims.into_vec(), strides.into_vec())
    }

    /// [`Layout::coalesced`], inline: the run iteration computes it once per call (and
    /// once per part of a split gather) without allocating.
    fn coalesced_inline(&self) -> (DimVec, DimVec) {
        let mut dims = DimVec::new();
        let mut strides = DimVec::new();
        for (&d, &s) in self.dims().iter().zip(&self.strides) {
            if d == 1 {
                continue;
            }
            match (dims.last_mut(), strides.last_mut()) {
                (Some(pd), Some(ps)) if *ps == s * d => {
                    *pd *= d;
                    *ps = s;
                }
                _ => {
                    dims.push(d);
                    strides.push(s);
                }
            }
        }
        if dims.is_empty() {
            (DimVec::from_slice(&[1]), DimVec::from_slice(&[1]))
        } else {
            (dims, strides)
        }
    }
}

/// Iterator over the storage offsets of a layout's elements (row-major).
pub struct StridedOffsets<'a> {
    layout: &'a Layout,
    index: Vec<usize>,
    next: Option<usize>,
}

impl<'a> StridedOffsets<'a> {
    fn new(layout: &'a Layout) -> Self {
        StridedOffsets {
            layout,
            index: vec![0; layout.rank()],
            next: (layout.elem_count() > 0).then_some(layout.offset),
        }
    }
}

impl Iterator for StridedOffsets<'_> {
    type Item = usize;
    #[inline]
    fn next(&mut self) -> Option<usize> {
        let cur = self.next?;
        let dims = self.layout.dims();
        let strides = self.layout.strides();
        let mut off = cur;
        let mut d = dims.len();
        loop {
            if d == 0 {
                self.next = None;
                break;
            }
            d -= 1;
            self.index[d] += 1;
            off += strides[d];
            if self.index[d] < dims[d] {
                self.next = Some(off);
                break;
            }
            off -= strides[d] * dims[d];
            self.index[d] = 0;
        }
        Some(cur)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_is_not_contiguous() {
        let l = Layout::contiguous([2, 3]);
        let t = l.transpose(0, 1).unwrap();
        assert!(!t.is_contiguous());
        assert_eq!(t.offsets().collect::<Vec<_>>(), vec![0, 3, 1, 4, 2, 5]);
    }

    #[test]
    fn runs_cover_all_offsets() {
        let l = Layout::contiguous([2, 3, 4])
            .permute(&[2usize, 0, 1])
            .unwrap();
        let mut v = Vec::new();
        l.for_each_run(|s, n, st| v.extend((0..n).map(|i| s + i * st)));
        assert_eq!(v, l.offsets().collect::<Vec<_>>());
    }

    /// `(start, len, stride)` of every run of `l`, checked against its offsets.
    fn runs(l: &Layout) -> Vec<(usize, usize, usize)> {
        let (mut runs, mut offsets) = (Vec::new(), Vec::new());
        l.for_each_run(|s, n, st| {
            runs.push((s, n, st));
            offsets.extend((0..n).map(|i| s + i * st));
        });
        assert_eq!(offsets, l.offsets().collect::<Vec<_>>(), "{l:?}");
        runs
    }

    #[test]
    fn runs_merge_dims_that_walk_memory_as_one() {
        // Broadcast dims: one run over the whole tensor.
        let e = Layout::contiguous([1]).broadcast_as(&[4, 3, 5]).unwrap();
        assert_eq!(runs(&e), vec![(0, 60, 0)]);
        // Rows of a column slice: the dims before it merge, the row stays a run.
        let s = Layout::contiguous([2, 3, 8]).slice(2, 1, 5, 1).unwrap();
        assert_eq!(
            runs(&s),
            vec![
                (1, 4, 1),
                (9, 4, 1),
                (17, 4, 1),
                (25, 4, 1),
                (33, 4, 1),
                (41, 4, 1)
            ]
        );
        // A bias broadcast over rows: runs of the row; a size-1 dim in between is dropped.
        let b = Layout::contiguous([1, 1, 3])
            .broadcast_as(&[2, 1, 3])
            .unwrap();
        assert_eq!(runs(&b), vec![(0, 3, 1), (0, 3, 1)]);
        // A transpose keeps its element-wise runs.
        let t = Layout::contiguous([2, 3]).transpose(0, 1).unwrap();
        assert_eq!(runs(&t), vec![(0, 2, 3), (1, 2, 3), (2, 2, 3)]);
        // Every dim of size 1 (a non-contiguous offset view of one element).
        let one = Layout::contiguous([4, 4])
            .slice(0, 2, 3, 1)
            .unwrap()
            .slice(1, 1, 2, 1)
            .unwrap();
        assert_eq!(runs(&one), vec![(9, 1, 1)]);
    }

    #[test]
    fn view_of_transposed_needs_copy() {
        let l = Layout::contiguous([2, 3]).transpose(0, 1).unwrap();
        assert!(l.view_strides(&[6]).is_none());
        assert_eq!(l.view_strides(&[3, 2, 1]).unwrap(), vec![1, 3, 3]);
        let c = Layout::contiguous([4, 6]);
        assert_eq!(c.view_strides(&[2, 2, 3, 2]).unwrap(), vec![12, 6, 2, 1]);
    }

    #[test]
    fn expand_and_slice() {
        let l = Layout::contiguous([3, 1]);
        let e = l.broadcast_as(&[2, 3, 4]).unwrap();
        assert_eq!(e.strides(), &[0, 1, 0]);
        assert!(l.broadcast_as(&[2, 2]).is_err());
        let s = Layout::contiguous([10]).slice(0, 1, 8, 3).unwrap();
        assert_eq!(s.offsets().collect::<Vec<_>>(), vec![1, 4, 7]);
    }
}
