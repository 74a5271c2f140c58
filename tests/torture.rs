//! Crash torture suite (being written).

fn main() {}
