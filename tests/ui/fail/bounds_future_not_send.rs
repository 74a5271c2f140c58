// Toolboxes run tools on multi-threaded runtimes: a body holding an `Rc` across `.await` is not Send.
use std::rc::Rc;

use durable::durable_tool;

/// Count words.
#[durable_tool(replay = "pure")]
async fn count_words(text: String) -> Result<usize, std::io::Error> {
    let shared = Rc::new(text);
    tokio::task::yield_now().await;
    Ok(shared.split_whitespace().count())
}

fn main() {}
