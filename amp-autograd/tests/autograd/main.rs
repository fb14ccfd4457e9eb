//! The integration tests of `amp-autograd`, one module per subject, in one test binary
//! (one link instead of one per file; `cargo test -p amp-autograd --release --test autograd <module>::`
//! runs one subject).

mod conv_grad;
mod deep_graph;
mod every_op;
mod extra;
mod gradcheck;
mod gradient_layout;
mod hooks;
mod linalg;
mod nesting;
mod out_of_memory;
mod pool;
mod refusals;
mod relu;
mod saved;
