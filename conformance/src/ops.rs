//! The op table: which vector `call` runs which workspace function. **Adding an op is
//! adding one entry here.**
//!
//! An entry takes the vector's arguments as the workspace's public API would be called by a
//! user (`amp_autograd::ops::mm(a, b)`, a layer's functional form, ...), never a private
//! shortcut, so ops reached through the dispatch point get autocast applied. Read arguments
//! with the accessors of [`Arg`](crate::args::Arg) (`tensor()?`, `int()?`, ...), look up
//! keywords with [`param`](crate::args::param), and call
//! [`Kwargs::only`](crate::args::Kwargs::only) with the keywords the entry understands, so
//! an unexpected keyword fails the case instead of being ignored:
//!
//! ```text
//! t.insert("torch.mm", |args, kwargs| {
//!     kwargs.only(&[])?;
//!     let (a, b) = (args[0].tensor()?, args[1].tensor()?);
//!     Ok(Output::Tensor(amp_autograd::ops::mm(a, b).map_err(|e| e.to_string())?))
//! });
//! ```
//!
//! The table is empty while the autograd and autocast crates are being written: every
//! autocast and grad case is then skipped, counted and listed as "op `NAME` not implemented
//! yet".

use amp_tensor::Tensor;

use crate::optable::OpTable;

/// The tensor type of the built-in backend's ops ([`crate::backend::Builtin`]).
pub type BuiltinTensor = Tensor;

/// The op table of the built-in backend.
pub fn table() -> OpTable<BuiltinTensor> {
    // One `t.insert(call, f)` per implemented call, as the crates implementing them land:
    //     let mut t = OpTable::new();
    //     t.insert("torch.mm", |args, kwargs| { ... });
    //     t
    OpTable::new()
}

/// The call that reaches each op of the documented lists that no vector exercises, for the
/// coverage report (ops with vectors take their call from the vectors). aten-internal names
/// map to the public function a user calls to reach them.
pub const CALLS_WITHOUT_VECTORS: &[(&str, &str)] = &[
    ("_convolution", "torch.nn.functional.conv2d"),
    ("grid_sampler", "torch.nn.functional.grid_sample"),
    ("grid_sampler_2d", "torch.nn.functional.grid_sample"),
    (
        "_grid_sampler_2d_cpu_fallback",
        "torch.nn.functional.grid_sample",
    ),
    ("grid_sampler_3d", "torch.nn.functional.grid_sample"),
    ("polar", "torch.polar"),
    ("stft", "torch.stft"),
    ("view_as_complex", "torch.view_as_complex"),
    ("cholesky", "torch.cholesky"),
    ("cholesky_inverse", "torch.cholesky_inverse"),
    ("cholesky_solve", "torch.cholesky_solve"),
    ("lu_solve", "torch.lu_solve"),
    ("orgqr", "torch.orgqr"),
    ("ormqr", "torch.ormqr"),
    ("max_unpool2d", "torch.nn.functional.max_unpool2d"),
    ("max_unpool3d", "torch.nn.functional.max_unpool3d"),
    ("ctc_loss", "torch.nn.functional.ctc_loss"),
    ("fft_fft", "torch.fft.fft"),
    ("fft_ifft", "torch.fft.ifft"),
    ("fft_fft2", "torch.fft.fft2"),
    ("fft_ifft2", "torch.fft.ifft2"),
    ("fft_fftn", "torch.fft.fftn"),
    ("fft_ifftn", "torch.fft.ifftn"),
    ("fft_rfft", "torch.fft.rfft"),
    ("fft_irfft", "torch.fft.irfft"),
    ("fft_rfft2", "torch.fft.rfft2"),
    ("fft_irfft2", "torch.fft.irfft2"),
    ("fft_rfftn", "torch.fft.rfftn"),
    ("fft_irfftn", "torch.fft.irfftn"),
    ("fft_hfft", "torch.fft.hfft"),
    ("fft_ihfft", "torch.fft.ihfft"),
    ("linalg_matrix_norm", "torch.linalg.matrix_norm"),
    ("linalg_cond", "torch.linalg.cond"),
    ("linalg_matrix_rank", "torch.linalg.matrix_rank"),
    ("linalg_eigvals", "torch.linalg.eigvals"),
    (
        "linalg_householder_product",
        "torch.linalg.householder_product",
    ),
    ("linalg_tensorinv", "torch.linalg.tensorinv"),
    ("linalg_tensorsolve", "torch.linalg.tensorsolve"),
    (
        "fake_quantize_per_tensor_affine",
        "torch.fake_quantize_per_tensor_affine",
    ),
    ("eig", "torch.eig"),
    ("geqrf", "torch.geqrf"),
    ("lstsq", "torch.lstsq"),
    ("_lu_with_info", "torch.lu"),
    ("qr", "torch.qr"),
    ("solve", "torch.solve"),
    ("svd", "torch.svd"),
    ("symeig", "torch.symeig"),
    ("triangular_solve", "torch.triangular_solve"),
    (
        "fractional_max_pool2d",
        "torch.nn.functional.fractional_max_pool2d",
    ),
    (
        "fractional_max_pool3d",
        "torch.nn.functional.fractional_max_pool3d",
    ),
    (
        "adaptive_max_pool3d",
        "torch.nn.functional.adaptive_max_pool3d",
    ),
    (
        "multilabel_margin_loss_forward",
        "torch.nn.functional.multilabel_margin_loss",
    ),
    ("linalg_qr", "torch.linalg.qr"),
    ("linalg_cholesky_ex", "torch.linalg.cholesky_ex"),
    ("linalg_svd", "torch.linalg.svd"),
    ("linalg_eig", "torch.linalg.eig"),
    ("linalg_eigh", "torch.linalg.eigh"),
    ("linalg_lstsq", "torch.linalg.lstsq"),
    ("linalg_inv_ex", "torch.linalg.inv_ex"),
];
