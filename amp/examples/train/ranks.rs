//! The main job over several processes (`--ddp`, feature `mpi`): every rank holds a
//! replica of the model, trains on its share of each batch (the batch's rows split in
//! rank order) and averages the gradients with the others during backward
//! ([`DistributedDataParallel`]), so every replica takes the step one process would take
//! on the whole batch. Rank 0 alone prints, plots and writes checkpoints.
//!
//! ```sh
//! cargo build --release -p amp --features mpi --example train
//! mpirun -np 2 -x RAYON_NUM_THREADS=1 target/release/examples/train --ddp
//! ```

use std::ops::{Deref, DerefMut};

use amp::autograd::{Result, Tensor};
#[cfg(feature = "mpi")]
use amp::distributed::{DistributedDataParallel, Mpi, ProcessGroup, ReduceOp};
#[cfg(feature = "mpi")]
use amp::nn::Module;

use crate::gpt::Gpt;
use crate::Res;

/// The model of a run: alone, or one replica of a data-parallel job.
pub enum Replica {
    Alone(Gpt),
    #[cfg(feature = "mpi")]
    Ddp(DistributedDataParallel<Gpt>),
}

impl Deref for Replica {
    type Target = Gpt;
    fn deref(&self) -> &Gpt {
        match self {
            Replica::Alone(g) => g,
            #[cfg(feature = "mpi")]
            Replica::Ddp(d) => d.module(),
        }
    }
}

impl DerefMut for Replica {
    fn deref_mut(&mut self) -> &mut Gpt {
        match self {
            Replica::Alone(g) => g,
            #[cfg(feature = "mpi")]
            Replica::Ddp(d) => d.module_mut(),
        }
    }
}

impl Replica {
    /// The training loss of a batch: through the wrapper's forward for a replica, so the
    /// backward that follows averages the gradients over the ranks.
    pub fn train_loss(&self, tokens: &Tensor, targets: &Tensor) -> Result<Tensor> {
        match self {
            Replica::Alone(g) => g.loss(tokens, targets),
            #[cfg(feature = "mpi")]
            Replica::Ddp(d) => crate::gpt::token_loss(&d.forward(tokens)?, targets),
        }
    }
}

/// The gradient communication of a run's steps on this rank (`--ddp`): sums of
/// [`amp::distributed::CommStats`] over the steps.
#[derive(Debug, Default)]
pub struct CommTotals {
    steps: usize,
    buckets: usize,
    bytes: usize,
    in_flight_s: f64,
    overlapped_s: f64,
    waited_s: f64,
}

impl CommTotals {
    /// Add the last backward's communication of `model` (nothing for a lone model).
    pub fn add(&mut self, model: &Replica) {
        #[cfg(feature = "mpi")]
        if let Replica::Ddp(d) = model {
            if let Some(c) = d.last_comm_stats() {
                self.steps += 1;
                self.buckets += c.buckets;
                self.bytes += c.bytes;
                self.in_flight_s += c.in_flight.as_secs_f64();
                self.overlapped_s += c.overlapped.as_secs_f64();
                self.waited_s += c.waited.as_secs_f64();
            }
        }
        #[cfg(not(feature = "mpi"))]
        let _ = model;
    }

    /// Per step: buckets, megabytes all-reduced, time in flight, the share of it that
    /// overlapped backward, and how long the end of backward waited; `None` without
    /// communication.
    pub fn summary(&self) -> Option<String> {
        if self.steps == 0 {
            return None;
        }
        let n = self.steps as f64;
        let share = if self.in_flight_s > 0.0 {
            (self.overlapped_s / self.in_flight_s).clamp(0.0, 1.0)
        } else {
            0.0
        };
        Some(format!(
            "{:.0} all-reduces, {:.2} MB, {:.1} ms in flight per step; {:.0}% of it overlapped backward, which waited {:.1} ms at its end",
            self.buckets as f64 / n,
            self.bytes as f64 / n / 1e6,
            self.in_flight_s / n * 1e3,
            share * 100.0,
            self.waited_s / n * 1e3
        ))
    }
}

/// This process's place in the job: rank 0 of 1, or a rank of an MPI job.
#[derive(Default)]
pub struct Ranks {
    #[cfg(feature = "mpi")]
    group: Option<std::sync::Arc<dyn ProcessGroup>>,
}

impl std::fmt::Debug for Ranks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (rank, size) = self.rank_size();
        write!(f, "rank {rank} of {size}")
    }
}

impl Ranks {
    /// The ranks of the MPI job this process was started in (`mpirun`).
    #[cfg(feature = "mpi")]
    pub fn mpi() -> Res<Ranks> {
        Ok(Ranks {
            group: Some(std::sync::Arc::new(Mpi::init()?)),
        })
    }

    /// `--ddp` in a build without MPI.
    #[cfg(not(feature = "mpi"))]
    pub fn mpi() -> Res<Ranks> {
        Err("--ddp needs the MPI backend: build with `--features mpi`".into())
    }

    /// This rank and the number of ranks.
    pub fn rank_size(&self) -> (usize, usize) {
        #[cfg(feature = "mpi")]
        if let Some(g) = &self.group {
            return (g.rank(), g.size());
        }
        (0, 1)
    }

    /// Whether this process prints and writes (rank 0).
    pub fn is_root(&self) -> bool {
        self.rank_size().0 == 0
    }

    /// `gpt` as this process's model: wrapped for data parallelism in a job of several
    /// ranks (rank 0's parameters are broadcast to the others).
    pub fn replica(&self, gpt: Gpt) -> Res<Replica> {
        #[cfg(feature = "mpi")]
        if let Some(g) = &self.group {
            return Ok(Replica::Ddp(DistributedDataParallel::new(gpt, g.clone())?));
        }
        Ok(Replica::Alone(gpt))
    }

    /// This rank's rows of a batch `(x, y)`: the batch split in equal parts in rank order.
    pub fn shard(&self, (x, y): (Tensor, Tensor)) -> Res<(Tensor, Tensor)> {
        let (rank, size) = self.rank_size();
        let rows = x.dims()[0];
        if rows % size != 0 {
            return Err(format!("--batch {rows} does not split over {size} ranks").into());
        }
        let per = rows / size;
        Ok((x.narrow(0, rank * per, per)?, y.narrow(0, rank * per, per)?))
    }

    /// Waits until every rank is here (after rank 0 wrote a checkpoint that the others may
    /// read next).
    pub fn barrier(&self) -> Res<()> {
        #[cfg(feature = "mpi")]
        if let Some(g) = &self.group {
            g.barrier()?;
        }
        Ok(())
    }

    /// The mean of `v` over the ranks (each rank's loss is that of its share).
    pub fn mean(&self, v: f64) -> Res<f64> {
        #[cfg(feature = "mpi")]
        if let Some(g) = &self.group {
            let t = amp::tensor::Tensor::from_vec(vec![v], [1])?;
            g.all_reduce(&t, ReduceOp::Avg)?;
            return Ok(t.to_vec::<f64>()?[0]);
        }
        Ok(v)
    }
}
