//! The `durable` command-line tool (being written).

fn main() {}
