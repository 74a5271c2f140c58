// Generated code names nothing through the prelude: shadowed `Result`, `Option`, `Box`,
// `Clone`, `String`, a glob that shadows `Vec`, and a local `mod core` change nothing.
#![allow(dead_code)]

mod core {}
mod std {}

mod shadows {
    pub struct Vec;
    pub struct Value;
    pub struct Journal;
}
use shadows::*;

struct Option;
struct Box;
trait Clone {}
type String = ::std::string::String;
type Result<T> = ::core::result::Result<T, ::std::io::Error>;

/// Echo a word back.
#[durable::durable_tool(replay = "pure")]
async fn echo(
    /// The word.
    word: String,
) -> Result<String> {
    Ok(word)
}

/// Count words, with the error type spelled out.
#[durable::durable_tool(replay = "idempotent_with_key", idempotency_key = |a| a.text.clone())]
async fn count(text: String) -> ::core::result::Result<usize, ::std::io::Error> {
    Ok(text.split(' ').count())
}

fn main() {
    let _ = (Vec, Value, Journal);
    assert_eq!(echo::spec().name, "echo");
    let _ = count::spec();
}
