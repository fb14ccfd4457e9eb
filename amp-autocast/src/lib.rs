//! Thread-local autocast regions applying amp-policy at the dispatch point.
