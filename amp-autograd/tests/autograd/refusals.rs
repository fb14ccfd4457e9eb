//! Loss inputs PyTorch refuses are refused here too, with its text (issue: a target batch
//! of 2 for 3 rows returned a loss; BCE of 1.5 returned NaN; a 0-dim input panicked).
//! The conformance crate's errors suite covers the other ops' arguments.

use amp_autograd::ops;
use amp_autograd::{Reduction, Tensor};

fn t(v: Vec<f32>, dims: &[usize]) -> Tensor {
    Tensor::from_vec(v, dims.to_vec()).unwrap()
}

#[test]
fn cross_entropy_needs_one_target_per_row() {
    let x = t(vec![0.1; 12], &[3, 4]);
    let y = Tensor::from_vec(vec![1i64, 2], [2]).unwrap();
    let e = ops::cross_entropy(&x, &y, None, -100, Reduction::Mean, 0.0).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Expected input batch_size (3) to match target batch_size (2)."
    );
    let e = ops::nll_loss(&x, &y, None, -100, Reduction::Mean).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Expected input batch_size (3) to match target batch_size (2)."
    );
}

#[test]
fn a_zero_dim_input_is_an_error_not_a_panic() {
    let x = Tensor::scalar(0.5f32);
    let y = Tensor::from_vec(vec![0i64], [1]).unwrap();
    let e = ops::cross_entropy(&x, &y, None, -100, Reduction::Mean, 0.0).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Dimension out of range (expected to be in range of [-1, 0], but got 1)"
    );
    let e = ops::nll_loss(&x, &y, None, -100, Reduction::Mean).unwrap_err();
    assert_eq!(e.to_string(), "Expected 1 or more dimensions (got 0)");
}

#[test]
fn binary_cross_entropy_needs_probabilities() {
    let y = t(vec![1.0, 0.0], &[2]);
    for bad in [vec![1.5f32, 0.5], vec![0.5, -0.5], vec![f32::NAN, 0.5]] {
        let e = ops::binary_cross_entropy(&t(bad.clone(), &[2]), &y, None, Reduction::Mean)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "all elements of input should be between 0 and 1",
            "{bad:?}"
        );
    }
    // The bounds themselves are probabilities.
    let l = ops::binary_cross_entropy(&t(vec![1.0, 0.0], &[2]), &y, None, Reduction::Mean);
    assert_eq!(l.unwrap().data().to_vec_f64(), [0.0]);
    let e =
        ops::binary_cross_entropy(&t(vec![0.5; 3], &[3]), &y, None, Reduction::Mean).unwrap_err();
    assert!(e.to_string().starts_with("Using a target size"), "{e}");
}
