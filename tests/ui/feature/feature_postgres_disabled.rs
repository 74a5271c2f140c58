// `durable::postgres` exists only when the `postgres` feature is enabled.
use durable::postgres::PostgresStore;

fn main() {
    let _ = std::mem::size_of::<PostgresStore>();
}
