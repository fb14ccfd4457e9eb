//! Conformance suite: PyTorch-computed vectors, golden snapshots and property tests for the amp workspace.
