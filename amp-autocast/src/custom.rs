//! `custom_fwd` / `custom_bwd` for user autograd functions (the "Custom autograd functions" recipes of PyTorch's AMP examples).

use amp_autograd::{Ctx, Function, Result, Tensor};
use amp_policy::DeviceType;
use amp_tensor::DType;

use crate::region::Autocast;
use crate::state::{device_state, DeviceState};

/// A [`Function`] with PyTorch's `@custom_fwd` / `@custom_bwd` behaviour.
///
/// Without `cast_inputs`, forward runs under the current autocast state and backward
/// runs under the state forward saw. With `cast_inputs = Some(dtype)` and autocast on
/// for `device`, floating inputs on `device` are cast to `dtype` and forward (and
/// backward) run with autocast off. Outside autocast both are no-ops. (Inputs are a
/// flat list: tensors that were inside lists or maps are cast the same way.)
pub struct CustomFwd<F> {
    inner: F,
    device: DeviceType,
    cast_inputs: Option<DType>,
}

/// Wrap `f` with `custom_fwd(device_type=device, cast_inputs=cast_inputs)` and
/// `custom_bwd`; call it with [`amp_autograd::apply`].
pub fn custom_fwd<F: Function>(
    f: F,
    device: DeviceType,
    cast_inputs: Option<DType>,
) -> CustomFwd<F> {
    CustomFwd {
        inner: f,
        device,
        cast_inputs,
    }
}

struct Saved(DeviceState);

impl<F: Function> Function for CustomFwd<F> {
    fn forward(&self, ctx: &mut Ctx, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let st = device_state(self.device);
        match self.cast_inputs {
            Some(dtype) if st.enabled => {
                let cast = inputs
                    .iter()
                    .map(|t| {
                        if t.dtype().is_floating_point() && t.device().device_type() == self.device
                        {
                            t.to_dtype(dtype)
                        } else {
                            Ok(t.clone())
                        }
                    })
                    .collect::<Result<Vec<_>>>()?;
                ctx.set(Saved(DeviceState {
                    enabled: false,
                    ..st
                }));
                Autocast::new(self.device)
                    .enabled(false)
                    .run(|| self.inner.forward(ctx, &cast))?
            }
            _ => {
                ctx.set(Saved(st));
                self.inner.forward(ctx, inputs)
            }
        }
    }

    fn backward(&self, ctx: &Ctx, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let st = ctx
            .get::<Saved>()
            .map(|s| s.0)
            .unwrap_or_else(|| device_state(self.device));
        let region = Autocast::new(self.device)
            .enabled(st.enabled)
            .dtype(st.dtype)
            .cache_enabled(st.cache_enabled);
        region.run(|| self.inner.backward(ctx, grads))?
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }
}
