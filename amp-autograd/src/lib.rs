//! Autograd tape with double backward and the single op dispatch point.
