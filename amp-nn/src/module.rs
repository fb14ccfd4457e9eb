//! The `Module` trait: forward, named parameters, train/eval, state dict.

use amp_autograd::{Error, Result, Tensor};
use amp_tensor::Tensor as Raw;

/// A layer or a model.
pub trait Module: Send + Sync {
    /// Apply the module.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;
    /// Parameters with PyTorch-style dotted names (`0.weight`, `fc.bias`), in
    /// registration order. None by default (activations, pooling, dropout).
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
    /// Switch training mode (dropout) on or off, recursively.
    fn train(&mut self, _mode: bool) {}
    /// Whether in training mode.
    fn is_training(&self) -> bool {
        true
    }

    /// The parameters, in registration order.
    fn parameters(&self) -> Vec<Tensor> {
        self.named_parameters()
            .into_iter()
            .map(|(_, t)| t)
            .collect()
    }
    /// Evaluation mode.
    fn eval(&mut self) {
        self.train(false)
    }
    /// Clear every parameter's gradient.
    fn zero_grad(&self) {
        for p in self.parameters() {
            p.zero_grad();
        }
    }
    /// Buffers: state that is not a parameter (running statistics), with PyTorch-style
    /// names, in registration order. None by default.
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
    /// Parameters and buffers in PyTorch's `state_dict` order: a module's parameters,
    /// then its buffers (containers go child by child).
    fn named_state(&self) -> Vec<(String, Tensor)> {
        let mut v = self.named_parameters();
        v.extend(self.named_buffers());
        v
    }
    /// Name → values of every parameter and buffer (copies), in PyTorch's order.
    fn state_dict(&self) -> Vec<(String, Raw)> {
        self.named_state()
            .into_iter()
            .map(|(n, t)| (n, t.data().copy()))
            .collect()
    }
    /// Copy values into the parameters and buffers by name; every name must match,
    /// shapes too.
    fn load_state_dict(&self, sd: &[(String, Raw)]) -> Result<()> {
        let params = self.named_state();
        for (name, p) in &params {
            let Some((_, v)) = sd.iter().find(|(n, _)| n == name) else {
                return Err(Error::invalid(
                    "load_state_dict",
                    format!("Missing key(s) in state_dict: \"{name}\"."),
                ));
            };
            if v.dims() != p.dims() {
                return Err(Error::invalid(
                    "load_state_dict",
                    format!("size mismatch for {name}: copying a param with shape {:?} from checkpoint, the shape in current model is {:?}.", v.dims(), p.dims()),
                ));
            }
            p.data().copy_(v)?;
        }
        for (n, _) in sd {
            if !params.iter().any(|(m, _)| m == n) {
                return Err(Error::invalid(
                    "load_state_dict",
                    format!("Unexpected key(s) in state_dict: \"{n}\"."),
                ));
            }
        }
        Ok(())
    }
    /// Move every parameter (with its gradient) and buffer to `device` in place
    /// (PyTorch's `module.to(device)`): the tensors keep their identity, so optimizers built on them
    /// afterwards, and clones of them, see the moved data. Call it on a freshly built
    /// module, before any view of a parameter exists.
    ///
    /// # Errors
    /// A device this build or machine lacks ([`amp_tensor::Error::DeviceUnavailable`]).
    fn to_device(&self, device: amp_tensor::Device) -> Result<()> {
        for (_, t) in self.named_state() {
            t.data().move_to_device_(device)?;
            // The gradient moves with its parameter, as `module.to(device)` moves it.
            if let Some(g) = t.grad() {
                g.data().move_to_device_(device)?;
            }
        }
        Ok(())
    }
    /// Number of parameter elements.
    fn num_parameters(&self) -> usize {
        self.parameters().iter().map(|p| p.elem_count()).sum()
    }
}

/// `named` with each name prefixed by `prefix.` (a container naming its children's
/// parameters, buffers or whole state).
pub fn prefix_names(prefix: &str, named: Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
    named
        .into_iter()
        .map(|(n, t)| (format!("{prefix}.{n}"), t))
        .collect()
}

/// The parameters that are present, by name, in order: an optional weight or bias that
/// is `None` is not a parameter (PyTorch registers it as `None`, and `named_parameters`
/// skips it).
pub fn named_present<'a>(
    params: impl IntoIterator<Item = (&'a str, Option<&'a Tensor>)>,
) -> Vec<(String, Tensor)> {
    params
        .into_iter()
        .filter_map(|(name, t)| Some((name.to_string(), t?.clone())))
        .collect()
}

/// The parameters of a layer with a `weight` and a `bias`, each optional, that are present.
pub(crate) fn weight_and_bias(
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
) -> Vec<(String, Tensor)> {
    named_present([("weight", weight), ("bias", bias)])
}

/// Prefix each parameter name of `m` with `prefix.`.
pub fn prefixed(prefix: &str, m: &dyn Module) -> Vec<(String, Tensor)> {
    prefix_names(prefix, m.named_parameters())
}
