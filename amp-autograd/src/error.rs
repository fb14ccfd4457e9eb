//! Errors of the autograd layer.

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// What can go wrong computing or differentiating.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An error from the tensor or kernel layer (shape, dtype, device, ...).
    #[error(transparent)]
    Tensor(#[from] amp_tensor::Error),
    /// A second backward through a graph whose buffers were freed.
    #[error("Trying to backward through the graph a second time (or directly access saved tensors after they have already been freed). Saved intermediate values of the graph are freed when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time or if you need to access saved tensors after calling backward.")]
    GraphFreed,
    /// `backward()` on a tensor that does not require grad.
    #[error("element 0 of tensors does not require grad and does not have a grad_fn")]
    NoGradFn,
    /// `backward()` without a gradient on a non-scalar output.
    #[error("grad can be implicitly created only for scalar outputs")]
    NonScalarBackward,
    /// An input of `grad()` the outputs do not depend on, without `allow_unused`.
    #[error("One of the differentiated Tensors appears to not have been used in the graph. Set allow_unused=True if this is the desired behavior.")]
    UnusedInput,
    /// `grad()` with an input that does not require grad.
    #[error("One of the differentiated Tensors does not require grad")]
    InputDoesNotRequireGrad,
    /// A gradient of the wrong shape or dtype was given or produced.
    #[error("{0}")]
    BadGradient(String),
    /// A dispatch layer (e.g. autocast) refused the op: the layer's own error, kept
    /// whole (`downcast_ref` recovers it, e.g. as `amp_autocast::AutocastError`).
    #[error(transparent)]
    Layer(amp_tensor::SharedError),
    /// A gradient hook failed (e.g. a data-parallel all-reduce started from a
    /// post-accumulate hook): the hook's own error, kept whole (`downcast_ref`).
    #[error(transparent)]
    Hook(amp_tensor::SharedError),
    /// A custom function's forward or backward failed.
    #[error("{0}")]
    Custom(String),
}

impl Error {
    /// Shorthand for an invalid-argument tensor error.
    pub fn invalid(op: &'static str, msg: impl Into<String>) -> Self {
        Error::Tensor(amp_tensor::Error::invalid(op, msg))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, thiserror::Error)]
    #[error("refused: {0}")]
    struct Refusal(u8);

    #[test]
    fn a_layer_error_keeps_its_type_and_text() {
        let e = Error::Layer(amp_tensor::SharedError::new(Refusal(7)));
        assert_eq!(e.to_string(), "refused: 7");
        let Error::Layer(layer) = &e else {
            unreachable!()
        };
        assert_eq!(layer.downcast_ref::<Refusal>(), Some(&Refusal(7)));
        assert!(layer.downcast_ref::<std::fmt::Error>().is_none());
        assert_eq!(e.clone(), e);
    }
}
