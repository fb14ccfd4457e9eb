//! Padding of the trailing dims: constant, reflect, replicate and circular, as
//! `torch.nn.functional.pad`. A pad is a gather within each plane by an index map shared
//! by all planes ([`pad_indices`]), so its gradient is the matching scatter-add.

use amp_tensor::pool::{try_collect, try_with_capacity};
use amp_tensor::{ensure, Error, Result, Tensor};

use crate::pool::{plane_gather, plane_scatter};

named_mode! {
    /// How positions outside the input are filled.
    pub enum PadMode {
        /// A constant value.
        Constant = "constant",
        /// The mirror image, excluding the edge (`reflect`).
        Reflect = "reflect",
        /// The edge value (`replicate`).
        Replicate = "replicate",
        /// Wrap around (`circular`).
        Circular = "circular",
    }
    else |other| -> Error { Error::invalid("pad", format!("Unrecognised padding mode {other}")) }
}

/// The source position of output position `o` along a dim of `size` padded by `before`
/// (negative pads crop); `None` outside the input in constant mode.
fn source(o: i64, size: i64, before: i64, mode: PadMode) -> Option<i64> {
    let i = o - before;
    match mode {
        PadMode::Constant => (0..size).contains(&i).then_some(i),
        PadMode::Replicate => Some(i.clamp(0, size - 1)),
        PadMode::Circular => Some(i.rem_euclid(size)),
        PadMode::Reflect => {
            if size == 1 {
                return Some(0);
            }
            let period = 2 * (size - 1);
            let m = i.rem_euclid(period);
            Some(if m < size { m } else { period - m })
        }
    }
}

/// The output sizes of padding `input` (spatial sizes) by `pads` (one `(before, after)`
/// per spatial dim, first dim first), checked as PyTorch checks them.
pub fn padded_sizes(input: &[usize], pads: &[(i64, i64)], mode: PadMode) -> Result<Vec<usize>> {
    let op = "pad";
    ensure!(
        input.len() == pads.len(),
        invalid(op, "one (before, after) pair per padded dim is needed")
    );
    let mut out = Vec::with_capacity(input.len());
    for (d, (&size, &(b, a))) in input.iter().zip(pads).enumerate() {
        let s = size as i64;
        match mode {
            PadMode::Reflect if b >= s || a >= s => {
                return Err(Error::invalid(
                    op,
                    format!("Argument #4: Padding size should be less than the corresponding input dimension, but got: padding ({b}, {a}) at dimension {d} of input {input:?}"),
                ))
            }
            PadMode::Circular if b > s || a > s => {
                return Err(Error::invalid(
                    op,
                    "Padding value causes wrapping around more than once.",
                ))
            }
            PadMode::Replicate | PadMode::Reflect | PadMode::Circular if s == 0 => {
                return Err(Error::invalid(
                    op,
                    format!("{mode:?} padding needs non-empty padded dims, got input {input:?}"),
                ))
            }
            _ => {}
        }
        let o = s + b + a;
        ensure!(!(o < 0 || (o == 0 && mode != PadMode::Constant)), invalid(op, "The input size {s}, plus negative padding {b} and {a} resulted in a negative output size, which is invalid. Check dimension {d} of your input."));
        out.push(o as usize);
    }
    Ok(out)
}

/// The flat input position (int64; `-1` for a constant fill) of every position of the
/// padded plane, shaped like the padded spatial dims.
pub fn pad_indices(input: &[usize], pads: &[(i64, i64)], mode: PadMode) -> Result<Tensor> {
    let out = padded_sizes(input, pads, mode)?;
    let mut idx: Vec<i64> = vec![0];
    for (d, (&size, &(b, _))) in input.iter().zip(pads).enumerate() {
        let src: Vec<Option<i64>> = try_collect(
            out[d],
            (0..out[d] as i64).map(|o| source(o, size as i64, b, mode)),
        )?;
        let mut next = try_with_capacity(idx.len().saturating_mul(src.len()))?;
        for &base in &idx {
            for s in &src {
                next.push(match (base, s) {
                    (b, Some(s)) if b >= 0 => b * size as i64 + s,
                    _ => -1,
                });
            }
        }
        idx = next;
    }
    Tensor::from_vec(idx, out)
}

/// Pad the trailing `pads.len()` dims of `x` (`pads[0]` is the first padded dim).
/// `value` fills constant padding.
pub fn pad(x: &Tensor, pads: &[(i64, i64)], mode: PadMode, value: f64) -> Result<Tensor> {
    let n = pads.len();
    ensure!(
        !(n == 0 || n > x.rank()),
        invalid(
            "pad",
            "Padding length too large: {} dims padded of a {}-d input",
            n,
            x.rank()
        )
    );
    let idx = pad_indices(&x.dims()[x.rank() - n..], pads, mode)?;
    plane_gather(x, n, &idx, value)
}

/// The gradient of [`pad`]: `g` (padded shape) summed back onto the input positions
/// (`input` are the unpadded spatial sizes).
pub fn pad_backward(
    g: &Tensor,
    input: &[usize],
    pads: &[(i64, i64)],
    mode: PadMode,
) -> Result<Tensor> {
    let idx = pad_indices(input, pads, mode)?;
    plane_scatter(g, &idx, input, true)
}
