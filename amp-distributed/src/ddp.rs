//! `DistributedDataParallel`: a module replicated on every rank whose gradients are
//! averaged in buckets while backward runs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use amp_autograd::{HookHandle, Tensor};
use amp_nn::{prefix_names, Module};
use amp_tensor::{DType, Device, Tensor as Raw};

use crate::{Error, ProcessGroup, ReduceOp, Result, Work};

/// PyTorch's default bucket size (`bucket_cap_mb=25`).
pub const DEFAULT_BUCKET_CAP_BYTES: usize = 25 * 1024 * 1024;

/// PyTorch's cap of the first bucket (`torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`,
/// 1 MiB): the gradients backward produces first go out in a small all-reduce, so
/// communication starts early in backward.
pub const DEFAULT_FIRST_BUCKET_CAP_BYTES: usize = 1024 * 1024;

/// Options of [`DistributedDataParallel`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DdpOptions {
    /// The most gradient bytes one bucket (one all-reduce) holds; a parameter larger
    /// than this has a bucket of its own.
    pub bucket_cap_bytes: usize,
    /// The most gradient bytes the first bucket of each dtype and device holds (the
    /// gradients backward produces first), as PyTorch's first-bucket cap; at most
    /// `bucket_cap_bytes` (the smaller of the two applies).
    pub first_bucket_cap_bytes: usize,
    /// Gradient compression (PyTorch's `bf16_compress_hook` / `fp16_compress_hook`):
    /// `Some(DType::BF16)` or `Some(DType::F16)` casts each float32 or float64 bucket to
    /// that type before its all-reduce and back after it (the average is taken in the
    /// wire type and rounded once to the 16-bit type). Buckets already 16-bit are
    /// reduced as they are. Any other dtype is refused with
    /// [`Error::UnsupportedCompression`]. The bytes handed to the group halve (float32)
    /// or quarter (float64); the NCCL backend sends them as they are, while the MPI
    /// backend widens 16-bit values to float32 on the wire (MPI has no 16-bit float), so
    /// there compression changes the precision but not the traffic.
    pub compression: Option<DType>,
}

impl Default for DdpOptions {
    fn default() -> Self {
        DdpOptions {
            bucket_cap_bytes: DEFAULT_BUCKET_CAP_BYTES,
            first_bucket_cap_bytes: DEFAULT_FIRST_BUCKET_CAP_BYTES,
            compression: None,
        }
    }
}

/// What the gradient synchronisation of one backward cost, and how much of it ran
/// while backward was still computing ([`DistributedDataParallel::last_comm_stats`]).
///
/// "Ready" is the moment the last gradient became final (the last hook, or
/// [`DistributedDataParallel::finish_gradient_sync`]). A bucket is in flight from its
/// launch until its all-reduce was seen complete (by a poll in a later hook, or by the
/// wait after ready). Backends without a progress thread (MPI) advance an operation only
/// while it is polled, so "in flight" is the time it could progress, not the time it
/// did.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CommStats {
    /// The number of all-reduces (buckets).
    pub buckets: usize,
    /// The bytes handed to the all-reduces (after compression).
    pub bytes: usize,
    /// The sum over the buckets of the time each was in flight.
    pub in_flight: Duration,
    /// The part of [`in_flight`](Self::in_flight) before ready: communication that
    /// overlapped backward.
    pub overlapped: Duration,
    /// The wall-clock time from ready until every all-reduce had completed and the
    /// averages were written back: how long the end of backward waited.
    pub waited: Duration,
}

impl CommStats {
    /// The share of the communication hidden behind backward,
    /// `overlapped / in_flight`, in `[0, 1]` (0 when nothing was in flight).
    pub fn overlap_share(&self) -> f64 {
        let total = self.in_flight.as_secs_f64();
        if total <= 0.0 {
            return 0.0;
        }
        (self.overlapped.as_secs_f64() / total).clamp(0.0, 1.0)
    }
}

/// Gradients flattened into one buffer, reduced by one all-reduce.
#[derive(Debug)]
struct Bucket {
    /// Indices into the reducer's parameters, with the offset of each in the buffer.
    params: Vec<(usize, usize)>,
    dtype: DType,
    /// Where the parameters, and so the flattened buffer, live.
    device: Device,
    numel: usize,
    /// Parameters whose gradient is final in this iteration.
    ready: usize,
    /// The flattened gradients (in the wire dtype) and their all-reduce, once launched.
    in_flight: Option<(Raw, Work)>,
    /// When the all-reduce was launched, and when it was seen complete.
    launched: Option<Instant>,
    completed: Option<Instant>,
}

/// The state of gradient synchronisation of one iteration.
#[derive(Debug)]
struct Reducer {
    group: Arc<dyn ProcessGroup>,
    params: Vec<Tensor>,
    /// The bucket of each parameter.
    bucket_of: Vec<usize>,
    buckets: Vec<Bucket>,
    /// Whether this iteration's gradients are to be synchronised (set by `forward`).
    armed: bool,
    /// Which parameters' gradients are final in this iteration.
    marked: Vec<bool>,
    /// Buckets are launched in index order, so that every rank issues the same
    /// all-reduces in the same order whatever order its gradients become ready in.
    next_launch: usize,
    /// The 16-bit type float32/float64 buckets travel as, if any.
    compression: Option<DType>,
    /// The statistics of the last synchronised backward.
    last_stats: Option<CommStats>,
}

impl Reducer {
    fn new(
        group: Arc<dyn ProcessGroup>,
        params: Vec<Tensor>,
        (first_cap, cap): (usize, usize),
        compression: Option<DType>,
    ) -> Reducer {
        // Reverse registration order: roughly the order backward produces gradients.
        let mut buckets: Vec<Bucket> = Vec::new();
        let mut bucket_of = vec![0; params.len()];
        // The open bucket of each dtype and device, and whether it is that key's first
        // (which has the smaller cap).
        let mut open: Vec<((DType, Device), usize, bool)> = Vec::new();
        for i in (0..params.len()).rev() {
            let (dtype, n) = (params[i].dtype(), params[i].elem_count());
            let key = (dtype, params[i].device());
            let bytes = n * dtype.size_in_bytes();
            let fits = |b: &Bucket, first: bool| {
                let limit = if first { first_cap.min(cap) } else { cap };
                b.numel * dtype.size_in_bytes() + bytes <= limit
            };
            let b = match open.iter().find(|(k, _, _)| *k == key) {
                Some(&(_, b, first)) if fits(&buckets[b], first) => b,
                _ => {
                    buckets.push(Bucket {
                        params: Vec::new(),
                        dtype,
                        device: key.1,
                        numel: 0,
                        ready: 0,
                        in_flight: None,
                        launched: None,
                        completed: None,
                    });
                    let first = !open.iter().any(|(k, _, _)| *k == key);
                    open.retain(|(k, _, _)| *k != key);
                    open.push((key, buckets.len() - 1, first));
                    buckets.len() - 1
                }
            };
            let bucket = &mut buckets[b];
            bucket.params.push((i, bucket.numel));
            bucket.numel += n;
            bucket_of[i] = b;
        }
        let marked = vec![false; params.len()];
        Reducer {
            group,
            params,
            bucket_of,
            buckets,
            armed: false,
            marked,
            next_launch: 0,
            compression,
            last_stats: None,
        }
    }

    /// Start an iteration: `sync` arms the reduction of the coming backward.
    fn prepare(&mut self, sync: bool) -> Result<()> {
        if self.armed && self.marked.iter().any(|&m| m) {
            return Err(Error::InvalidArgument {
                op: "DistributedDataParallel.forward",
                msg: "Expected to have finished reduction in the prior iteration before starting a new one: some parameters received no gradient; call finish_gradient_sync() after backward when parameters can go unused".into(),
            });
        }
        self.armed = sync;
        self.marked.iter_mut().for_each(|m| *m = false);
        self.buckets.iter_mut().for_each(|b| {
            b.ready = 0;
            b.in_flight = None;
            b.launched = None;
            b.completed = None;
        });
        self.next_launch = 0;
        Ok(())
    }

    /// Parameter `i`'s gradient is final: launch what is complete, and once every
    /// bucket is launched, wait for them and write the averages back.
    fn mark_ready(&mut self, i: usize) -> Result<()> {
        if !self.armed {
            return Ok(());
        }
        if self.marked[i] {
            return Err(Error::InvalidArgument {
                op: "DistributedDataParallel",
                msg: format!("Expected to mark a variable ready only once; parameter {i} was marked twice in this iteration (a second backward without a forward through the DistributedDataParallel module)"),
            });
        }
        self.marked[i] = true;
        self.buckets[self.bucket_of[i]].ready += 1;
        self.launch_complete()?;
        // A transport without a progress thread advances when polled.
        for b in &mut self.buckets[..self.next_launch] {
            if let Some((_, w)) = &mut b.in_flight {
                if b.completed.is_none() && w.is_completed()? {
                    b.completed = Some(Instant::now());
                }
            }
        }
        if self.next_launch == self.buckets.len() {
            self.finalize()?;
        }
        Ok(())
    }

    fn launch_complete(&mut self) -> Result<()> {
        while let Some(b) = self.buckets.get_mut(self.next_launch) {
            if b.ready < b.params.len() {
                break;
            }
            let flat = Raw::zeros_on([b.numel], b.dtype, b.device)?;
            for &(i, off) in &b.params {
                if let Some(g) = self.params[i].grad() {
                    let n = g.elem_count();
                    flat.narrow(0, off, n)?.copy_(&g.data().reshape([n])?)?;
                }
            }
            let wire = match self.compression {
                Some(c) if matches!(b.dtype, DType::F32 | DType::F64) => flat.to_dtype(c)?,
                _ => flat,
            };
            let work = self.group.all_reduce_async(&wire, ReduceOp::Avg)?;
            b.in_flight = Some((wire, work));
            b.launched = Some(Instant::now());
            self.next_launch += 1;
        }
        Ok(())
    }

    /// Wait for every bucket and copy the averaged gradients into `.grad` (a parameter
    /// with no gradient on this rank gets the average too, so all ranks agree).
    fn finalize(&mut self) -> Result<()> {
        self.armed = false;
        let ready = Instant::now();
        let mut stats = CommStats {
            buckets: self.buckets.len(),
            ..CommStats::default()
        };
        for b in &mut self.buckets {
            let (wire, work) = b.in_flight.take().expect("every bucket launched");
            work.wait()?;
            let completed = *b.completed.get_or_insert_with(Instant::now);
            let launched = b.launched.unwrap_or(ready);
            stats.bytes += wire.elem_count() * wire.dtype().size_in_bytes();
            stats.in_flight += completed.saturating_duration_since(launched);
            stats.overlapped += completed.min(ready).saturating_duration_since(launched);
            let flat = if wire.dtype() == b.dtype {
                wire
            } else {
                wire.to_dtype(b.dtype)?
            };
            for &(i, off) in &b.params {
                let p = &self.params[i];
                let avg = flat.narrow(0, off, p.elem_count())?.reshape(p.dims())?;
                match p.grad() {
                    Some(g) => g.data().copy_(&avg)?,
                    None => p.set_grad(Some(Tensor::from_raw(avg.try_contiguous()?)))?,
                }
            }
        }
        self.marked.iter_mut().for_each(|m| *m = false);
        stats.waited = ready.elapsed();
        self.last_stats = Some(stats);
        Ok(())
    }
}

/// Data-parallel training (`torch.nn.parallel.DistributedDataParallel`): every rank
/// holds the same module and runs it on its own part of the batch; backward averages
/// the gradients over the ranks, so an optimizer step is the same everywhere.
///
/// - At construction rank 0's parameters and floating-point buffers are broadcast
///   (integer buffers, counters, are left alone).
/// - Gradients are grouped into buckets of about [`DdpOptions::bucket_cap_bytes`]
///   (the first, which backward fills first, of [`DdpOptions::first_bucket_cap_bytes`];
///   reverse registration order, one dtype and device per bucket, the flattened
///   buffer on the parameters' device). A post-accumulate hook on each
///   parameter marks its gradient ready; a complete bucket is flattened into one buffer
///   and its all-reduce (average) starts at once, while backward goes on with the
///   earlier layers. The last hook waits for all buckets and copies the averages back
///   into `.grad`, so after `loss.backward()` returns every rank holds the same
///   gradients.
/// - Only the first backward after a [`forward`](Module::forward) through this wrapper
///   is synchronised (a second one accumulates locally, as in PyTorch). When some parameters may go without a gradient in an iteration,
///   call [`finish_gradient_sync`](Self::finish_gradient_sync) after backward (their
///   gradient then counts as zero).
/// - [`no_sync`](Self::no_sync) accumulates gradients locally (gradient
///   accumulation); the first synchronised backward after it averages the sums.
///
/// Parameters are named `module.<name>`, as PyTorch names them;
/// [`module`](Self::module) is the wrapped module.
pub struct DistributedDataParallel<M: Module> {
    module: M,
    reducer: Arc<Mutex<Reducer>>,
    hooks: Vec<HookHandle>,
    require_sync: AtomicBool,
}

impl<M: Module> std::fmt::Debug for DistributedDataParallel<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = self.reducer();
        f.debug_struct("DistributedDataParallel")
            .field("rank", &r.group.rank())
            .field("size", &r.group.size())
            .field("buckets", &r.buckets.len())
            .finish_non_exhaustive()
    }
}

impl<M: Module> DistributedDataParallel<M> {
    /// Wrap `module`, with [`DdpOptions::default`].
    pub fn new(module: M, group: Arc<dyn ProcessGroup>) -> Result<Self> {
        Self::with_options(module, group, DdpOptions::default())
    }

    /// Wrap `module`: broadcast its state from rank 0 and register the gradient hooks.
    /// Fails with [`Error::UnsupportedCompression`] when
    /// [`DdpOptions::compression`] is not bfloat16 or float16.
    pub fn with_options(module: M, group: Arc<dyn ProcessGroup>, opts: DdpOptions) -> Result<Self> {
        if let Some(dtype) = opts.compression {
            if !matches!(dtype, DType::BF16 | DType::F16) {
                return Err(Error::UnsupportedCompression { dtype });
            }
        }
        for (_, t) in module.named_state() {
            if t.dtype().is_floating_point() {
                group.broadcast(t.data(), 0)?;
            }
        }
        let params: Vec<Tensor> = module
            .parameters()
            .into_iter()
            .filter(Tensor::requires_grad)
            .collect();
        let reducer = Arc::new(Mutex::new(Reducer::new(
            group,
            params.clone(),
            (opts.first_bucket_cap_bytes, opts.bucket_cap_bytes),
            opts.compression,
        )));
        let mut hooks = Vec::with_capacity(params.len());
        for (i, p) in params.iter().enumerate() {
            // A weak handle: the parameters hold the hooks, the reducer the parameters.
            let weak: Weak<Mutex<Reducer>> = Arc::downgrade(&reducer);
            hooks.push(p.register_post_accumulate_grad_hook(move |_| {
                let Some(r) = weak.upgrade() else {
                    return Ok(());
                };
                let mut r = r.lock().unwrap_or_else(|e| e.into_inner());
                Ok(r.mark_ready(i)?)
            })?);
        }
        Ok(DistributedDataParallel {
            module,
            reducer,
            hooks,
            require_sync: AtomicBool::new(true),
        })
    }

    fn reducer(&self) -> MutexGuard<'_, Reducer> {
        self.reducer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The wrapped module.
    pub fn module(&self) -> &M {
        &self.module
    }

    /// The wrapped module, mutably (its mode, its own methods; the parameters stay the
    /// ones the hooks were registered on).
    pub fn module_mut(&mut self) -> &mut M {
        &mut self.module
    }

    /// The process group.
    pub fn group(&self) -> Arc<dyn ProcessGroup> {
        self.reducer().group.clone()
    }

    /// The number of buckets (all-reduces per synchronised backward).
    pub fn num_buckets(&self) -> usize {
        self.reducer().buckets.len()
    }

    /// The communication statistics of the last synchronised backward (see
    /// [`CommStats`]); `None` before the first one.
    pub fn last_comm_stats(&self) -> Option<CommStats> {
        self.reducer().last_stats
    }

    /// Skip gradient synchronisation for the forward/backward passes made while the
    /// guard lives (PyTorch's `with ddp.no_sync():`); gradients accumulate locally.
    pub fn no_sync(&self) -> NoSync<'_, M> {
        let previous = self.require_sync.swap(false, Ordering::AcqRel);
        NoSync {
            ddp: self,
            previous,
        }
    }

    /// Finish this iteration's synchronisation after backward: the parameters that got
    /// no gradient count as zero, the remaining buckets are reduced and every
    /// parameter's `.grad` holds the average. Nothing to do (and `Ok`) when backward
    /// already finished it, or outside a synchronised iteration.
    pub fn finish_gradient_sync(&self) -> Result<()> {
        let mut r = self.reducer();
        if !r.armed {
            return Ok(());
        }
        for i in 0..r.params.len() {
            if !r.marked[i] {
                r.marked[i] = true;
                let b = r.bucket_of[i];
                r.buckets[b].ready += 1;
            }
        }
        r.launch_complete()?;
        r.finalize()
    }
}

impl<M: Module> Drop for DistributedDataParallel<M> {
    fn drop(&mut self) {
        self.hooks.iter().for_each(HookHandle::remove);
    }
}

impl<M: Module> Module for DistributedDataParallel<M> {
    fn forward(&self, x: &Tensor) -> amp_autograd::Result<Tensor> {
        let sync = self.require_sync.load(Ordering::Acquire) && amp_autograd::is_grad_enabled();
        self.reducer().prepare(sync)?;
        self.module.forward(x)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        prefix_names("module", self.module.named_parameters())
    }
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        prefix_names("module", self.module.named_buffers())
    }
    fn train(&mut self, mode: bool) {
        self.module.train(mode)
    }
    fn is_training(&self) -> bool {
        self.module.is_training()
    }
}

/// Returned by [`DistributedDataParallel::no_sync`]; synchronisation comes back when it
/// drops.
#[must_use = "gradients are synchronised again as soon as the guard drops"]
pub struct NoSync<'a, M: Module> {
    ddp: &'a DistributedDataParallel<M>,
    previous: bool,
}

impl<M: Module> Drop for NoSync<'_, M> {
    fn drop(&mut self) {
        self.ddp
            .require_sync
            .store(self.previous, Ordering::Release);
    }
}
