//! Autocast behaviour: nesting as in the `torch.amp` documentation's examples, thread isolation, panic safety,
//! the weight-cast cache, custom_fwd/custom_bwd, grads of float32 leaves, the trace.

use amp_autocast::*;
use amp_autograd::{apply, ops, Ctx, Function, Reduction, Tensor};
use amp_policy::{CastPolicy, DeviceType, Profile};
use amp_tensor::{DType, Generator};

const CPU: DeviceType = DeviceType::Cpu;

fn rand8(g: &mut Generator) -> Tensor {
    Tensor::rand([8, 8], DType::F32, g).unwrap()
}

#[test]
fn seed_004_mixed_inputs_and_exit() {
    let mut g = Generator::new(0);
    let (a, b, d) = (rand8(&mut g), rand8(&mut g), rand8(&mut g));
    let (e, f) = autocast(CPU, DType::BF16, || {
        // torch.mm is on autocast's list of ops that should run in lower precision.
        let e = ops::mm(&a, &b).unwrap();
        // Also handles mixed input types
        let f = ops::mm(&d, &e).unwrap();
        (e, f)
    })
    .unwrap();
    assert_eq!(e.dtype(), DType::BF16);
    assert_eq!(f.dtype(), DType::BF16);
    // After exiting autocast, mixed dtypes are an error; f.float() fixes it.
    assert!(ops::mm(&d, &f).is_err());
    let g32 = ops::mm(&d, &f.float().unwrap()).unwrap();
    assert_eq!(g32.dtype(), DType::F32);
}

#[test]
fn seed_004_disabled_subregion_nested() {
    let mut g = Generator::new(1);
    let (a, b, c, d) = (rand8(&mut g), rand8(&mut g), rand8(&mut g), rand8(&mut g));
    let _outer = Autocast::new(CPU).enter().unwrap();
    let e = ops::mm(&a, &b).unwrap();
    assert_eq!(e.dtype(), DType::BF16);
    let f = {
        let _inner = Autocast::new(CPU).enabled(false).enter().unwrap();
        assert!(!is_autocast_enabled(CPU));
        // Calls e.float() to ensure float32 execution
        ops::mm(&c, &e.float().unwrap()).unwrap()
    };
    assert_eq!(f.dtype(), DType::F32);
    assert!(is_autocast_enabled(CPU));
    // No manual casts are required when re-entering the autocast-enabled region.
    let g16 = ops::mm(&d, &f).unwrap();
    assert_eq!(g16.dtype(), DType::BF16);
    // enabled inside disabled inside enabled
    let _off = Autocast::new(CPU).enabled(false).enter().unwrap();
    let _on = Autocast::new(CPU).enter().unwrap();
    assert_eq!(ops::mm(&a, &b).unwrap().dtype(), DType::BF16);
    assert_eq!(autocast_depth(), 3);
}

#[test]
fn defaults_and_validation() {
    assert!(!is_autocast_enabled(CPU));
    assert_eq!(get_autocast_dtype(CPU), DType::BF16);
    assert_eq!(get_autocast_dtype(DeviceType::Cuda), DType::F16);
    let e = Autocast::new(CPU).dtype(DType::F32).enter().err().unwrap();
    assert_eq!(
        e.to_string(),
        "In CPU autocast, but the target dtype float32 is not supported. CPU Autocast only supports dtypes of torch.bfloat16, torch.float16 currently."
    );
    // a disabled region does not validate its dtype
    assert!(Autocast::new(CPU)
        .dtype(DType::F64)
        .enabled(false)
        .enter()
        .is_ok());
}

#[test]
fn state_is_thread_local() {
    let _g = Autocast::new(CPU).enter().unwrap();
    assert!(is_autocast_enabled(CPU));
    let seen = std::thread::spawn(|| is_autocast_enabled(CPU))
        .join()
        .unwrap();
    assert!(!seen, "a spawned thread starts with autocast off");
    let a = Tensor::ones([4, 4], DType::F32);
    let dtypes: Vec<DType> = {
        use rayon::prelude::*;
        (0..8)
            .into_par_iter()
            .map(|_| ops::mm(&a, &a).unwrap().dtype())
            .collect()
    };
    // rayon workers run on other threads (autocast off) — or inline on this one (on)
    let here = ops::mm(&a, &a).unwrap().dtype();
    assert_eq!(here, DType::BF16);
    let on_worker = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap()
        .install(|| is_autocast_enabled(CPU));
    assert!(!on_worker, "a rayon worker sees autocast off");
    assert!(dtypes.iter().all(|d| *d == DType::BF16 || *d == DType::F32));
}

#[test]
fn panic_restores_state() {
    let r = std::panic::catch_unwind(|| {
        let _g = Autocast::new(CPU).enter().unwrap();
        assert!(is_autocast_enabled(CPU));
        panic!("boom");
    });
    assert!(r.is_err());
    assert!(!is_autocast_enabled(CPU));
    assert_eq!(autocast_depth(), 0);
    let a = Tensor::ones([2, 2], DType::F32);
    assert_eq!(
        ops::mm(&a, &a).unwrap().dtype(),
        DType::F32,
        "layer uninstalled"
    );
}

#[test]
fn weight_cache_casts_a_parameter_once_and_clears() {
    let w = Tensor::parameter(amp_tensor::Tensor::ones([4, 4], DType::F32)).unwrap();
    let x = Tensor::ones([2, 4], DType::F32);
    let (_, trace) = traced(Autocast::new(CPU), || {
        let h = ops::linear(&x, &w, None).unwrap();
        let h = ops::linear(&h, &w, None).unwrap();
        assert_eq!(cache_len(), 1);
        h
    })
    .unwrap();
    assert_eq!(cache_len(), 0, "outermost exit clears the cache");
    assert_eq!(trace.cache_hits(), 1, "{trace}");
    // no growth across regions
    for _ in 0..3 {
        autocast(CPU, DType::BF16, || ops::linear(&x, &w, None).unwrap()).unwrap();
        assert_eq!(cache_len(), 0);
    }
    // cache off
    let (_, t) = traced(Autocast::new(CPU).cache_enabled(false), || {
        ops::linear(&x, &w, None).unwrap();
        ops::linear(&x, &w, None).unwrap();
        assert_eq!(cache_len(), 0);
    })
    .unwrap();
    assert_eq!(t.cache_hits(), 0);
    // keyed by (tensor, dtype): a float16 region nested in a bfloat16 one gets float16
    let _outer = Autocast::new(CPU).dtype(DType::BF16).enter().unwrap();
    assert_eq!(ops::linear(&x, &w, None).unwrap().dtype(), DType::BF16);
    let _inner = Autocast::new(CPU).dtype(DType::F16).enter().unwrap();
    assert_eq!(ops::linear(&x, &w, None).unwrap().dtype(), DType::F16);
}

#[test]
fn float32_leaves_get_float32_grads() {
    let mut g = Generator::new(3);
    let w =
        Tensor::parameter(amp_tensor::Tensor::randn([4, 3], DType::F32, &mut g).unwrap()).unwrap();
    let b = Tensor::parameter(amp_tensor::Tensor::randn([4], DType::F32, &mut g).unwrap()).unwrap();
    let x = Tensor::randn([5, 3], DType::F32, &mut g).unwrap();
    let loss = autocast(CPU, DType::BF16, || {
        let y = ops::linear(&x, &w, Some(&b)).unwrap();
        assert_eq!(y.dtype(), DType::BF16);
        ops::sum_all(&ops::relu(&y).unwrap()).unwrap()
    })
    .unwrap();
    loss.backward().unwrap();
    crate::assert_f32_grads(&[&w, &b]);
}

#[test]
fn fp32_policy_and_promote_and_unlisted() {
    let x = Tensor::full([3], 0.5, DType::BF16);
    let y = Tensor::full([3], 2.0, DType::F32);
    autocast(CPU, DType::BF16, || {
        // mse_loss is on the cpu fp32 list
        assert_eq!(
            ops::mse_loss(&x, &x, Reduction::Mean).unwrap().dtype(),
            DType::F32
        );
        // atan2 promotes to the widest eligible type
        assert_eq!(ops::atan2(&x, &y).unwrap().dtype(), DType::F32);
        assert_eq!(ops::atan2(&x, &x).unwrap().dtype(), DType::BF16);
        // float64 is never cast, and is ignored by promote
        let d = Tensor::full([3], 1.0, DType::F64);
        assert_eq!(
            ops::mm(&d.reshape([3, 1]).unwrap(), &d.reshape([1, 3]).unwrap())
                .unwrap()
                .dtype(),
            DType::F64
        );
        // unlisted ops run in their input types
        assert_eq!(ops::add(&y, &y).unwrap().dtype(), DType::F32);
        assert_eq!(ops::exp(&x).unwrap().dtype(), DType::BF16);
        // an explicit dtype= is never autocast
        assert_eq!(
            ops::sum(&x, &[], false, Some(DType::F64)).unwrap().dtype(),
            DType::F64
        );
    })
    .unwrap();
}

#[test]
fn cuda_policies_via_the_pure_decision() {
    let cuda = DeviceType::Cuda;
    let p = Profile::docs();
    let arg = |dtype, device| ArgInfo { dtype, device };
    let (f32a, f16a, f64a) = (
        arg(DType::F32, cuda),
        arg(DType::F16, cuda),
        arg(DType::F64, cuda),
    );
    let cpu32 = arg(DType::F32, CPU);
    let plain = CallFlags::default();
    let inplace = CallFlags {
        inplace: true,
        ..Default::default()
    };
    let out = CallFlags {
        out: true,
        ..Default::default()
    };
    let (h, f) = (Some(DType::F16), Some(DType::F32));
    // (op, argument infos, flags, the cast of each argument); none sets a dtype.
    type Case<'a> = (&'a str, &'a [ArgInfo], CallFlags, Vec<Option<DType>>);
    let cases: [Case<'_>; 9] = [
        ("mm", &[f32a, f32a], plain, vec![h; 2]),
        ("mm", &[f32a, f64a], plain, vec![h, None]),
        ("mm", &[f32a, cpu32], plain, vec![h, None]),
        ("exp", &[f16a], plain, vec![f]),
        ("atan2", &[f16a, f32a], plain, vec![f, None]),
        ("atan2", &[f16a, f64a], plain, vec![None, None]),
        ("cat", &[f16a, f32a], plain, vec![None, None]),
        ("mm", &[f32a, f32a], inplace, vec![None, None]),
        ("mm", &[f32a, f32a], out, vec![None, None]),
    ];
    // A float16 CUDA region's plan for `op` under `profile`.
    let plan = |profile: &Profile, op: &str, args: &[ArgInfo], flags: CallFlags| {
        decide(
            profile.policy_by_name(cuda, op),
            profile.banned_message(cuda, op),
            cuda,
            DType::F16,
            args,
            flags,
        )
    };
    for (op, args, flags, expect) in cases {
        let plan = plan(&p, op, args, flags).unwrap();
        assert_eq!(plan.casts, expect, "{op}");
        assert_eq!(plan.set_dtype, None, "{op}");
    }
    let e = plan(&p, "binary_cross_entropy", &[f16a, f16a], plain).unwrap_err();
    assert!(e.to_string().starts_with(
        "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast."
    ));
    // Reaching the user through autograd, the refusal keeps its type, not only its text.
    let through = amp_autograd::Error::from(e.clone());
    assert_eq!(through.to_string(), e.to_string());
    let amp_autograd::Error::Layer(layer) = &through else {
        panic!("an autocast refusal is a layer error: {through:?}")
    };
    assert_eq!(layer.downcast_ref::<AutocastError>(), Some(&e));
    // fp32_set_opt_dtype (torch-2.15's cuda sum): no cast, but dtype=float32 unless given
    let t = Profile::torch_2_15();
    for (explicit_dtype, set) in [(false, Some(DType::F32)), (true, None)] {
        let flags = CallFlags {
            accepts_dtype: true,
            explicit_dtype,
            ..Default::default()
        };
        let plan = plan(&t, "sum", &[f16a], flags).unwrap();
        assert_eq!(
            (plan.casts, plan.set_dtype),
            (vec![None], set),
            "{explicit_dtype}"
        );
    }
    // cpu runs binary_cross_entropy in float32
    assert_eq!(
        p.policy_by_name(CPU, "binary_cross_entropy"),
        CastPolicy::Fp32
    );
}

#[test]
fn overrides_scoped_to_a_region() {
    let a = Tensor::ones([2, 2], DType::F32);
    let prof = Profile::docs()
        .with_override(CPU, "mm", CastPolicy::Fp32)
        .with_ban(CPU, "exp", "no exp here");
    autocast(CPU, DType::BF16, || {
        let _g = Autocast::new(CPU).profile(prof.clone()).enter().unwrap();
        assert_eq!(ops::mm(&a, &a).unwrap().dtype(), DType::F32);
        assert_eq!(ops::exp(&a).unwrap_err().to_string(), "no exp here");
    })
    .unwrap();
    autocast(CPU, DType::BF16, || {
        assert_eq!(ops::mm(&a, &a).unwrap().dtype(), DType::BF16)
    })
    .unwrap();
}

struct Scale2;
impl Function for Scale2 {
    fn forward(&self, ctx: &mut Ctx, inputs: &[Tensor]) -> amp_autograd::Result<Vec<Tensor>> {
        ctx.set(is_autocast_enabled(CPU));
        ctx.save_for_backward(&[&inputs[0]]);
        Ok(vec![ops::mm(&inputs[0], &inputs[1])?])
    }
    fn backward(
        &self,
        ctx: &Ctx,
        grads: &[Option<Tensor>],
    ) -> amp_autograd::Result<Vec<Option<Tensor>>> {
        // backward runs under the state forward saw
        assert_eq!(is_autocast_enabled(CPU), *ctx.get::<bool>().unwrap());
        let g = grads[0].clone().unwrap();
        Ok(vec![
            Some(g.clone()),
            Some(ops::mm(&ops::t(&ctx.saved_tensors()[0])?, &g)?),
        ])
    }
}

#[test]
fn custom_fwd_without_cast_inputs_runs_under_current_state() {
    let a = Tensor::parameter(amp_tensor::Tensor::ones([2, 2], DType::F32)).unwrap();
    let b = Tensor::parameter(amp_tensor::Tensor::ones([2, 2], DType::F32)).unwrap();
    let out = autocast(CPU, DType::BF16, || {
        apply(custom_fwd(Scale2, CPU, None), &[a.clone(), b.clone()]).unwrap()
    })
    .unwrap();
    assert_eq!(out[0].dtype(), DType::BF16, "forward's mm autocast");
    ops::sum_all(&out[0]).unwrap().backward().unwrap();
    assert_eq!(b.grad().unwrap().dtype(), DType::F32);
}

#[test]
fn custom_fwd_with_cast_inputs_runs_with_autocast_off() {
    let a = Tensor::parameter(amp_tensor::Tensor::ones([2, 2], DType::F32)).unwrap();
    let b = Tensor::parameter(amp_tensor::Tensor::ones([2, 2], DType::F32)).unwrap();
    let out = autocast(CPU, DType::BF16, || {
        apply(
            custom_fwd(Scale2, CPU, Some(DType::F16)),
            &[a.clone(), b.clone()],
        )
        .unwrap()
    })
    .unwrap();
    assert_eq!(
        out[0].dtype(),
        DType::F16,
        "inputs cast to float16, body ran with autocast off"
    );
    ops::sum_all(&out[0]).unwrap().backward().unwrap();
    assert_eq!(
        a.grad().unwrap().dtype(),
        DType::F32,
        "grads cast back to the inputs' dtype"
    );
    // outside autocast: a no-op
    let out = apply(
        custom_fwd(Scale2, CPU, Some(DType::F16)),
        &[a.clone(), b.clone()],
    )
    .unwrap();
    assert_eq!(out[0].dtype(), DType::F32);
}

#[test]
fn wrap_is_the_decorator_form() {
    let w = Tensor::ones([3, 3], DType::F32);
    let x = Tensor::ones([1, 3], DType::F32);
    let forward = Autocast::new(CPU).wrap(|x: &Tensor| ops::mm(x, &w).unwrap());
    assert_eq!(forward(&x).unwrap().dtype(), DType::BF16);
    assert!(!is_autocast_enabled(CPU));
}

#[test]
fn trace_explains_decisions() {
    let a = Tensor::ones([2, 2], DType::F32);
    let (_, t) = traced(Autocast::new(CPU), || {
        let y = ops::mm(&a, &a).unwrap();
        ops::mse_loss(&y, &a, Reduction::Mean).unwrap()
    })
    .unwrap();
    let mm = t.events.iter().find(|e| e.op == "mm").unwrap();
    assert_eq!(mm.policy, CastPolicy::LowerPrecisionFp);
    assert_eq!(mm.dtypes_out, vec![DType::BF16, DType::BF16]);
    assert_eq!(mm.casts, 2);
    let mse = t.events.iter().find(|e| e.op == "mse_loss").unwrap();
    assert_eq!(mse.dtypes_out, vec![DType::F32, DType::F32]);
    assert!(t.to_string().contains("lower_precision_fp"));
}

/// `mm`, `bmm` and `matmul` whose arguments need no gradient read their float32
/// arguments as the region's dtype, with no cast tensors: the dtype and bits of the
/// casts written by hand, at the direct kernel's sizes and the packing kernels'. With an
/// argument that requires grad the casts are made (on the tape) and its float32 leaf
/// gets a float32 gradient; under `no_grad` such a leaf still goes through the weight
/// cache, and the bits are the same.
#[test]
fn products_without_gradients_read_their_arguments_as_the_lower_dtype() {
    use amp_testing::tensors::bits;
    let mut g = Generator::new(5);
    for (m, k, n) in [(8, 8, 8), (40, 31, 70), (96, 96, 96)] {
        let a = Tensor::randn([m, k], DType::F32, &mut g).unwrap();
        let b = Tensor::randn([k, n], DType::F32, &mut g).unwrap();
        let cast = |t: &Tensor| t.to_dtype(DType::BF16).unwrap();
        // `op` under autocast against `op` of the casts written by hand.
        let check = |op: fn(&Tensor, &Tensor) -> amp_autograd::Result<Tensor>,
                     x: &Tensor,
                     y: &Tensor,
                     what: String| {
            let manual = op(&cast(x), &cast(y)).unwrap();
            let auto = autocast(CPU, DType::BF16, || op(x, y)).unwrap().unwrap();
            assert_eq!(auto.dtype(), DType::BF16, "{what}");
            assert_eq!(bits(auto.data()), bits(manual.data()), "{what}");
            manual
        };
        let manual = check(ops::mm, &a, &b, format!("mm {m}x{k}x{n}"));
        check(ops::matmul, &a, &b, format!("matmul {m}x{k}x{n}"));
        let (a3, b3) = (
            ops::stack(&[a.clone(), a.clone()], 0).unwrap(),
            ops::stack(&[b.clone(), b.clone()], 0).unwrap(),
        );
        check(ops::bmm, &a3, &b3, format!("bmm 2x{m}x{k}x{n}"));
        // A weight that requires grad: cast on the tape, float32 gradient.
        let w = b.detach();
        w.requires_grad_(true).unwrap();
        let y = autocast(CPU, DType::BF16, || ops::mm(&a, &w))
            .unwrap()
            .unwrap();
        assert_eq!(y.dtype(), DType::BF16);
        assert_eq!(bits(y.data()), bits(manual.data()));
        ops::sum_all(&y).unwrap().backward().unwrap();
        assert_eq!(w.grad().unwrap().dtype(), DType::F32);
        let y = amp_autograd::no_grad(|| autocast(CPU, DType::BF16, || ops::mm(&a, &w)))
            .unwrap()
            .unwrap();
        assert_eq!(bits(y.data()), bits(manual.data()));
    }
}
