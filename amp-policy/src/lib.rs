//! Op policy registry (being built).
