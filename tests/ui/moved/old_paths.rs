// Items that moved (see CHANGELOG.md): the old paths still resolve, each with a
// deprecation warning that names the new one (denied here to pin the messages).
#![deny(deprecated)]

fn main() {
    let _: Option<durable::Outcome> = None;
    let _: Option<durable::ArgumentErrorKind> = None;
    let _: Option<durable::toolbox::Toolbox> = None;
    let _: Option<durable::toolbox::ToolOutput> = None;
}
