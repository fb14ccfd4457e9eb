//! Arithmetic operators on tensors, as `candle` has them: each returns
//! [`Result<Tensor>`](crate::Result) (shapes and dtypes can fail to broadcast), and the
//! left operand may itself be such a result, so an expression reads as PyTorch's:
//!
//! ```
//! use amp_autograd::Tensor;
//!
//! let a = Tensor::from_vec(vec![1.0f32, 2.0], [2])?;
//! let b = Tensor::from_vec(vec![10.0f32, 20.0], [2])?;
//! // 2*a + 3*b - 1, each operator one recorded op (as `ops::add`, `ops::mul_scalar`, ...)
//! let y = ((&a * 2.0) + (&b * 3.0)?)? - 1.0;
//! assert_eq!(y?.to_vec_f64(), vec![31.0, 63.0]);
//! // A `Result` on the left takes a tensor directly; before a scalar it needs its `?`.
//! let w = (&a + &b) * &b;
//! assert_eq!(w?.to_vec_f64(), vec![110.0, 440.0]);
//! let z = (-&a)? / &b;
//! assert_eq!(z?.to_vec_f64(), vec![-0.1f32 as f64, -0.1f32 as f64]);
//! # Ok::<(), amp_autograd::Error>(())
//! ```
//!
//! `tensor op tensor` is the broadcasting `ops::{add, sub, mul, div}`; `tensor op
//! scalar` is `ops::{add_scalar, mul_scalar, div_scalar}` (`- s` is `+ (-s)`);
//! `scalar + tensor` and `scalar * tensor` commute. An error on the left is passed on
//! unchanged.

use std::ops::{Add, Div, Mul, Neg, Sub};

use crate::{ops, Result, Tensor};

/// `lhs op rhs` for every mix of owned, borrowed and `Result` operands.
macro_rules! tensor_ops {
    ($($Op:ident $method:ident $f:path;)*) => {$(
        impl $Op<&Tensor> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                $f(self, rhs)
            }
        }
        impl $Op<Tensor> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                $f(self, &rhs)
            }
        }
        impl $Op<&Tensor> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                $f(&self, rhs)
            }
        }
        impl $Op<Tensor> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                $f(&self, &rhs)
            }
        }
        impl $Op<&Tensor> for Result<Tensor> {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                $f(&self?, rhs)
            }
        }
        impl $Op<Tensor> for Result<Tensor> {
            type Output = Result<Tensor>;
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                $f(&self?, &rhs)
            }
        }
    )*};
}

tensor_ops! {
    Add add ops::add;
    Sub sub ops::sub;
    Mul mul ops::mul;
    Div div ops::div;
}

/// `tensor op f64` for an owned or borrowed tensor (a `Result` on the left needs its `?`
/// first: the orphan rule allows no `Result<Tensor> op f64`).
macro_rules! scalar_ops {
    ($($Op:ident $method:ident |$t:ident, $s:ident| $body:expr;)*) => {$(
        impl $Op<f64> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, $s: f64) -> Result<Tensor> {
                let $t = self;
                $body
            }
        }
        impl $Op<f64> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, $s: f64) -> Result<Tensor> {
                let $t = &self;
                $body
            }
        }
    )*};
}

scalar_ops! {
    Add add |t, s| ops::add_scalar(t, s);
    Sub sub |t, s| ops::add_scalar(t, -s);
    Mul mul |t, s| ops::mul_scalar(t, s);
    Div div |t, s| ops::div_scalar(t, s);
}

impl Add<&Tensor> for f64 {
    type Output = Result<Tensor>;
    fn add(self, rhs: &Tensor) -> Result<Tensor> {
        ops::add_scalar(rhs, self)
    }
}

impl Mul<&Tensor> for f64 {
    type Output = Result<Tensor>;
    fn mul(self, rhs: &Tensor) -> Result<Tensor> {
        ops::mul_scalar(rhs, self)
    }
}

impl Neg for &Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        ops::neg(self)
    }
}

impl Neg for Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        ops::neg(&self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: &[f32]) -> Tensor {
        Tensor::from_vec(v.to_vec(), [v.len()]).unwrap()
    }

    #[test]
    fn operators_are_the_ops_and_record_the_graph() {
        let a = t(&[1.0, -2.0, 3.0]);
        let b = t(&[0.5, 4.0, -1.0]);
        a.requires_grad_(true).unwrap();
        let via_ops = ops::add(
            &ops::mul_scalar(&a, 2.0).unwrap(),
            &ops::div(&a, &b).unwrap(),
        )
        .unwrap();
        let via_operators = ((&a * 2.0) + (&a / &b).unwrap()).unwrap();
        assert_eq!(via_operators.to_vec_f64(), via_ops.to_vec_f64());
        assert!(via_operators.requires_grad());
        let loss = ops::sum_all(&via_operators).unwrap();
        loss.backward().unwrap();
        // d/da (2a + a/b) = 2 + 1/b
        let want: Vec<f64> = [0.5f32, 4.0, -1.0]
            .iter()
            .map(|&b| (2.0f32 + 1.0 / b) as f64)
            .collect();
        assert_eq!(a.grad().unwrap().to_vec_f64(), want);
    }

    #[test]
    fn every_operand_form() {
        let a = t(&[1.0, 2.0]);
        let b = t(&[3.0, 5.0]);
        let v = |r: Result<Tensor>| r.unwrap().to_vec_f64();
        assert_eq!(v(&a + &b), vec![4.0, 7.0]);
        assert_eq!(v(&a - b.clone()), vec![-2.0, -3.0]);
        assert_eq!(v(a.clone() * &b), vec![3.0, 10.0]);
        assert_eq!(v(b.clone() / a.clone()), vec![3.0, 2.5]);
        assert_eq!(v((&a + &b) * &b), vec![12.0, 35.0]);
        assert_eq!(v((&a + &b) - b.clone()), vec![1.0, 2.0]);
        assert_eq!(v(&a + 1.0), vec![2.0, 3.0]);
        assert_eq!(v(&a - 1.0), vec![0.0, 1.0]);
        assert_eq!(v(b.clone() / 2.0), vec![1.5, 2.5]);
        assert_eq!(v((&a * 3.0).unwrap() * 2.0), vec![6.0, 12.0]);
        assert_eq!(v(2.0 * &a), vec![2.0, 4.0]);
        assert_eq!(v(1.0 + &a), vec![2.0, 3.0]);
        assert_eq!(v(-&a), vec![-1.0, -2.0]);
        assert_eq!(v(-a.clone()), vec![-1.0, -2.0]);
    }

    #[test]
    fn errors_come_back_and_pass_through() {
        let a = t(&[1.0, 2.0]);
        let c = t(&[1.0, 2.0, 3.0]);
        let e = (&a + &c).unwrap_err();
        assert_eq!(e, ops::add(&a, &c).unwrap_err());
        // An error on the left is passed on, not hidden by the right operand.
        assert_eq!(((&a + &c) * &a).unwrap_err(), e);
    }
}
