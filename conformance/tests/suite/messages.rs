//! Golden snapshots of the user-facing texts PyTorch users search for: the banned
//! `binary_cross_entropy` message, every GradScaler error, the GradScaler state dict, and
//! the autocast unsupported-dtype error. A change to any of them is a visible diff here.

use amp::autocast::{decide, ArgInfo, Autocast, CallFlags};
use amp::policy::{CastPolicy, DeviceType, Profile};
use amp::scaler::{GradScaler, GradScalerOptions, ScalerError};
use amp::tensor::DType;

#[test]
fn banned_binary_cross_entropy_on_cuda() {
    let profile = Profile::docs();
    let docs = profile
        .banned_message(DeviceType::Cuda, "binary_cross_entropy")
        .expect("binary_cross_entropy is banned on cuda");
    insta::assert_snapshot!("banned_bce_docs", docs);

    // What autocast raises for a call of the op in a cuda region.
    assert_eq!(
        profile.listed_policy(DeviceType::Cuda, "binary_cross_entropy"),
        CastPolicy::Banned
    );
    let args = [
        ArgInfo {
            dtype: DType::F16,
            device: DeviceType::Cuda,
        },
        ArgInfo {
            dtype: DType::F32,
            device: DeviceType::Cuda,
        },
    ];
    let err = decide(
        CastPolicy::Banned,
        Some(docs),
        DeviceType::Cuda,
        DType::F16,
        &args,
        CallFlags::default(),
    )
    .expect_err("a banned op is refused");
    let raised = err.to_string();
    assert_eq!(raised, docs);
    insta::assert_snapshot!("banned_bce_decide", raised);
}

/// Every error of the GradScaler whose text is PyTorch's own (the variants wrapping another
/// crate's error or a serde message are not), with its variant name. The match is
/// exhaustive, so a new variant must be classified here.
fn pytorch_texts() -> Vec<(&'static str, ScalerError)> {
    let all = vec![
        ("GrowthFactor", ScalerError::GrowthFactor),
        ("BackoffFactor", ScalerError::BackoffFactor),
        (
            "ScaleIsNone(unscale_)",
            ScalerError::ScaleIsNone("unscale_"),
        ),
        ("ScaleIsNone(step)", ScalerError::ScaleIsNone("step")),
        ("ScaleIsNone(update)", ScalerError::ScaleIsNone("update")),
        ("AlreadyUnscaled", ScalerError::AlreadyUnscaled),
        ("UnscaleAfterStep", ScalerError::UnscaleAfterStep),
        ("Fp16Gradients", ScalerError::Fp16Gradients),
        ("Closure", ScalerError::Closure),
        ("AlreadyStepped", ScalerError::AlreadyStepped),
        (
            "NoInfChecksForOptimizer",
            ScalerError::NoInfChecksForOptimizer,
        ),
        ("NoInfChecks", ScalerError::NoInfChecks),
        ("BadNewScale", ScalerError::BadNewScale),
        ("EmptyStateDict", ScalerError::EmptyStateDict),
        ("NotATensor", ScalerError::NotATensor),
    ];
    for (_, e) in &all {
        let pytorch = match e {
            ScalerError::GrowthFactor
            | ScalerError::BackoffFactor
            | ScalerError::ScaleIsNone(_)
            | ScalerError::AlreadyUnscaled
            | ScalerError::UnscaleAfterStep
            | ScalerError::Fp16Gradients
            | ScalerError::Closure
            | ScalerError::AlreadyStepped
            | ScalerError::NoInfChecksForOptimizer
            | ScalerError::NoInfChecks
            | ScalerError::BadNewScale
            | ScalerError::EmptyStateDict
            | ScalerError::NotATensor => true,
            ScalerError::BadStateDict(_)
            | ScalerError::FoundInfReduction(_)
            | ScalerError::Optim(_)
            | ScalerError::Autograd(_)
            | ScalerError::Tensor(_) => false,
        };
        assert!(pytorch);
    }
    all
}

#[test]
fn grad_scaler_error_messages() {
    let text: String = pytorch_texts()
        .into_iter()
        .map(|(name, e)| format!("{name}: {e}\n"))
        .collect();
    insta::assert_snapshot!("grad_scaler_errors", text);
}

#[test]
fn grad_scaler_errors_are_raised_with_those_texts() {
    // The constructor's two, as raised.
    let e = GradScaler::with_options(GradScalerOptions::default().growth_factor(1.0)).unwrap_err();
    assert_eq!(e, ScalerError::GrowthFactor);
    let e = GradScaler::with_options(GradScalerOptions::default().backoff_factor(1.0)).unwrap_err();
    assert_eq!(e, ScalerError::BackoffFactor);
    // update() before any scale() / step().
    let mut s = GradScaler::new();
    assert_eq!(
        s.update().unwrap_err().to_string(),
        ScalerError::ScaleIsNone("update").to_string()
    );
    let empty = serde_json::json!({});
    assert_eq!(
        s.load_state_dict_json(&empty).unwrap_err(),
        ScalerError::EmptyStateDict
    );
}

#[test]
fn grad_scaler_state_dict_json() {
    let fresh = GradScaler::new();
    insta::assert_snapshot!(
        "state_dict_enabled_default",
        fresh.state_dict_json().to_string()
    );
    let custom = GradScaler::with_options(
        GradScalerOptions::default()
            .init_scale(1024.5)
            .growth_factor(1.001)
            .backoff_factor(0.9)
            .growth_interval(7),
    )
    .unwrap();
    insta::assert_snapshot!(
        "state_dict_enabled_custom",
        custom.state_dict_json().to_string()
    );
    let disabled = GradScaler::with_options(GradScalerOptions::default().enabled(false)).unwrap();
    insta::assert_snapshot!(
        "state_dict_disabled",
        disabled.state_dict_json().to_string()
    );
}

#[test]
fn autocast_unsupported_dtype() {
    let cases = [
        (
            DeviceType::Cpu,
            DType::F64,
            "autocast_unsupported_dtype_cpu",
        ),
        (
            DeviceType::Cuda,
            DType::F32,
            "autocast_unsupported_dtype_cuda",
        ),
    ];
    for (device, dtype, snapshot) in cases {
        let msg = Autocast::new(device)
            .dtype(dtype)
            .enter()
            .err()
            .unwrap_or_else(|| panic!("{dtype:?} is not a {device:?} autocast dtype"))
            .to_string();
        insta::assert_snapshot!(snapshot, msg);
    }
}
