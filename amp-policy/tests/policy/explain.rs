//! The `explain` sentences.

use amp_policy::{CastPolicy, DeviceType, Profile};

const CPU: DeviceType = DeviceType::Cpu;
const CUDA: DeviceType = DeviceType::Cuda;

#[test]
fn listed_op() {
    assert_eq!(
        Profile::docs().explain(CUDA, "mm"),
        "mm on cuda: lower_precision_fp (autocast to the lower-precision dtype) — from the \
         documented CUDA list `CUDA Ops that can autocast to float16` (profile docs)"
    );
    assert_eq!(
        Profile::docs().explain(CPU, "binary_cross_entropy"),
        "binary_cross_entropy on cpu: fp32 (autocast to float32) — from the documented CPU list \
         `CPU Ops that can autocast to float32` (profile docs)"
    );
    assert_eq!(
        Profile::docs().explain(CPU, "cat"),
        "cat on cpu: promote (inputs cast to the widest floating type among them) — from the \
         documented CPU list `CPU Ops that promote to the widest input type` (profile docs)"
    );
}

#[test]
fn unlisted_op() {
    assert_eq!(
        Profile::docs().explain(CPU, "GRUCell"),
        "GRUCell on cpu: none (runs in its input types) — on no CPU list of profile docs, so \
         autocast does not cast it"
    );
    // A name never seen before.
    assert_eq!(
        Profile::torch_2_15().explain(CUDA, "an_op_nobody_interned"),
        "an_op_nobody_interned on cuda: none (runs in its input types) — on no CUDA list of \
         profile torch-2.15, so autocast does not cast it"
    );
}

#[test]
fn banned_op_includes_its_message() {
    assert_eq!(
        Profile::docs().explain(CUDA, "binary_cross_entropy"),
        "binary_cross_entropy on cuda: banned (fails under autocast) — from the documented CUDA \
         list `Prefer binary_cross_entropy_with_logits over binary_cross_entropy` (profile docs). \
         Error message:\n\
         torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n\
         Many models use a sigmoid layer right before the binary cross entropy layer.\n\
         In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n\
         or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n\
         safe to autocast."
    );
}

#[test]
fn aliased_op() {
    assert_eq!(
        Profile::docs().explain(CPU, "grid_sample"),
        "grid_sample on cpu: fp32 (autocast to float32) — as `grid_sampler` \
         (torch.nn.functional.grid_sample calls aten::grid_sampler, which the CPU list \
         documents), from the documented CPU list `CPU Ops that can autocast to float32` \
         (profile docs)"
    );
}

#[test]
fn profile_change() {
    assert_eq!(
        Profile::torch_2_15().explain(CPU, "conv_transpose2d"),
        "conv_transpose2d on cpu: lower_precision_fp (autocast to the lower-precision dtype) — \
         from profile torch-2.15: PyTorch 2.15 runs conv_transpose in bfloat16 under CPU \
         autocast (measured); the documentation lists it in float32; replaces fp32 from the \
         documented CPU list `CPU Ops that can autocast to float32`"
    );
    // Entries the profile does not change still cite the documented list.
    assert!(Profile::torch_2_15()
        .explain(CUDA, "mm")
        .ends_with("`CUDA Ops that can autocast to float16` (profile torch-2.15)"));
}

#[test]
fn user_override() {
    let p = Profile::torch_2_15().with_override(CUDA, "sum", CastPolicy::Fp32);
    assert_eq!(
        p.explain(CUDA, "sum"),
        "sum on cuda: fp32 (autocast to float32) — from a user override (profile torch-2.15); \
         replaces fp32_set_opt_dtype from profile torch-2.15"
    );
}
